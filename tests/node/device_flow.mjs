// The device authorization grant as openid-client (unmodified, from npm) runs it:
// discovery, the device authorization request, then polling until the person
// at the verification page answers. Prints one JSON line with the codes to show,
// then one with what the tokens say (or the error the polling ended with).
import * as client from 'openid-client';

const [issuer, clientId, scope] = process.argv.slice(2);
const config = await client.discovery(new URL(issuer), clientId, undefined, client.None(), {
  execute: [client.allowInsecureRequests],
});
const started = await client.initiateDeviceAuthorization(config, { scope });
console.log(JSON.stringify({
  user_code: started.user_code,
  verification_uri: started.verification_uri,
  verification_uri_complete: started.verification_uri_complete,
  interval: started.interval,
}));
try {
  const tokens = await client.pollDeviceAuthorizationGrant(config, started);
  console.log(JSON.stringify({
    sub: tokens.claims()?.sub,
    scope: tokens.scope,
    token_type: tokens.token_type,
    refresh: Boolean(tokens.refresh_token),
  }));
} catch (error) {
  console.log(JSON.stringify({ error: error.error ?? error.code ?? String(error) }));
}
