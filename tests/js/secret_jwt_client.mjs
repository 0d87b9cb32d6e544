// openid-client, unmodified, as a client_secret_jwt machine client of authsrv:
// discovery, client_credentials with an HMAC assertion keyed with the secret,
// then introspection of the token authenticated the same way. Prints one JSON
// object with what it got.
// Usage: node secret_jwt_client.mjs ISSUER CLIENT_ID CLIENT_SECRET
import * as client from "openid-client";

const [issuer, clientId, secret] = process.argv.slice(2);
const config = await client.discovery(
  new URL(issuer), clientId, {}, client.ClientSecretJwt(secret),
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
