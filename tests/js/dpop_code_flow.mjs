// openid-client, unmodified, as a confidential web client of authsrv using
// DPoP (RFC 9449), pushed authorization requests (RFC 9126) and
// private_key_jwt: it pushes its request with a DPoP proof, prints the
// authorization URL as one JSON line, reads the URL the user's browser was
// sent back to from stdin, checks that response (state, iss), redeems the
// code, refreshes, calls UserInfo with DPoP and introspects its token.
// Before redeeming, it shows that it refuses the response with iss removed
// or naming another issuer (RFC 9207). Prints one JSON object with what it got.
// Usage: node dpop_code_flow.mjs ISSUER CLIENT_ID CLIENT_JWK DPOP_JWK REDIRECT_URI
import { createInterface } from "node:readline";
import * as client from "openid-client";

const [issuer, clientId, clientJwkText, dpopJwkText, redirectUri] = process.argv.slice(2);
const ec = { name: "ECDSA", namedCurve: "P-256" };
const clientJwk = JSON.parse(clientJwkText);
const signingKey = await crypto.subtle.importKey("jwk", clientJwk, ec, false, ["sign"]);
const { d, ...dpopPublic } = JSON.parse(dpopJwkText);
const dpopKeys = {
  privateKey: await crypto.subtle.importKey("jwk", { ...dpopPublic, d }, ec, false, ["sign"]),
  publicKey: await crypto.subtle.importKey("jwk", dpopPublic, ec, true, ["verify"]),
};

const config = await client.discovery(
  new URL(issuer), clientId, { id_token_signed_response_alg: "ES256" },
  client.PrivateKeyJwt({ key: signingKey, kid: clientJwk.kid }),
  { execute: [client.allowInsecureRequests] },
);
const DPoP = client.getDPoPHandle(config, dpopKeys);
const codeVerifier = client.randomPKCECodeVerifier();
const checks = { pkceCodeVerifier: codeVerifier, expectedState: client.randomState(), expectedNonce: client.randomNonce() };
const authorizationUrl = await client.buildAuthorizationUrlWithPAR(config, {
  redirect_uri: redirectUri,
  scope: "openid profile offline_access",
  code_challenge: await client.calculatePKCECodeChallenge(codeVerifier),
  code_challenge_method: "S256",
  state: checks.expectedState,
  nonce: checks.expectedNonce,
}, { DPoP });
console.log(JSON.stringify({ authorization_url: authorizationUrl.href }));

const lines = createInterface({ input: process.stdin });
const callback = new URL((await lines[Symbol.asyncIterator]().next()).value);
lines.close();

async function refusal(url) {
  try {
    await client.authorizationCodeGrant(config, url, checks, undefined, { DPoP });
    return null;
  } catch (error) {
    return error.message;
  }
}
const otherIssuer = new URL(callback);
otherIssuer.searchParams.set("iss", "https://attacker.example");
const noIssuer = new URL(callback);
noIssuer.searchParams.delete("iss");

const refused = { other_iss: await refusal(otherIssuer), no_iss: await refusal(noIssuer) };
const tokens = await client.authorizationCodeGrant(config, callback, checks, undefined, { DPoP });
const claims = tokens.claims();
const refreshed = await client.refreshTokenGrant(config, tokens.refresh_token, undefined, { DPoP });
const userinfo = await client.fetchUserInfo(config, refreshed.access_token, claims.sub, { DPoP });
const introspection = await client.tokenIntrospection(config, refreshed.access_token);
console.log(JSON.stringify({
  refused,
  token_type: tokens.token_type,
  refreshed_token_type: refreshed.token_type,
  access_token: tokens.access_token,
  refreshed_access_token: refreshed.access_token,
  sub: claims.sub,
  userinfo,
  introspection,
}));
