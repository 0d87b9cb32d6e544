// openid-client, unmodified, as a machine client of authsrv: discovery,
// client_credentials with private_key_jwt (a private JWK) or client_secret_jwt
// (the client secret), then introspection of the token authenticated the same
// way. Prints one JSON object with what it got.
// Usage: node machine_client.mjs ISSUER CLIENT_ID private_key_jwt PRIVATE_JWK_JSON
//        node machine_client.mjs ISSUER CLIENT_ID client_secret_jwt SECRET
import * as client from "openid-client";

const [issuer, clientId, method, credential] = process.argv.slice(2);
let auth;
if (method === "client_secret_jwt") {
  auth = client.ClientSecretJwt(credential);
} else {
  const jwk = JSON.parse(credential);
  const algorithm = { name: "ECDSA", namedCurve: "P-256" };
  const key = await crypto.subtle.importKey("jwk", jwk, algorithm, false, ["sign"]);
  auth = client.PrivateKeyJwt({ key, kid: jwk.kid });
}
const config = await client.discovery(new URL(issuer), clientId, {}, auth, { execute: [client.allowInsecureRequests] });
const tokens = await client.clientCredentialsGrant(config, { scope: "reports.read" });
const introspection = await client.tokenIntrospection(config, tokens.access_token);
console.log(JSON.stringify({
  token_type: tokens.token_type,
  scope: tokens.scope,
  has_refresh_token: "refresh_token" in tokens,
  introspection,
}));
