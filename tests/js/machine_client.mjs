// openid-client, unmodified, as a machine client of authsrv: discovery,
// client_credentials with private_key_jwt, then introspection of the token
// authenticated the same way. Prints one JSON object with what it got.
// Usage: node machine_client.mjs ISSUER CLIENT_ID PRIVATE_JWK_JSON
import * as client from "openid-client";

const [issuer, clientId, jwkText] = process.argv.slice(2);
const jwk = JSON.parse(jwkText);
const algorithm = { name: "ECDSA", namedCurve: "P-256" };
const key = await crypto.subtle.importKey("jwk", jwk, algorithm, false, ["sign"]);
const config = await client.discovery(
  new URL(issuer), clientId, {}, client.PrivateKeyJwt({ key, kid: jwk.kid }),
  { execute: [client.allowInsecureRequests] },
);
const tokens = await client.clientCredentialsGrant(config, { scope: "reports.read" });
const introspection = await client.tokenIntrospection(config, tokens.access_token);
console.log(JSON.stringify({
  token_type: tokens.token_type,
  scope: tokens.scope,
  has_refresh_token: "refresh_token" in tokens,
  introspection,
}));
