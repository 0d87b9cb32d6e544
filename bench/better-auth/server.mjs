// Better Auth with its OAuth provider plugin on PostgreSQL, the system whose
// contract authsrv serves, for bench/bench.py --store postgres: the demo's user
// and clients, RS256 ID tokens, rate limits off (authsrv's are set beyond any
// run). Usage: node server.mjs PORT POSTGRESQL_URL
import http from "node:http";
import pg from "pg";
import { betterAuth } from "better-auth";
import { getMigrations } from "better-auth/db/migration";
import { toNodeHandler } from "better-auth/node";
import { admin, jwt } from "better-auth/plugins";
import { oauthProvider } from "@better-auth/oauth-provider";

const [port, url] = [Number(process.argv[2]), process.argv[3]];
const base = `http://127.0.0.1:${port}`;
// Clients get the demo's ids and secrets, so the bench drives every server alike.
const chosen = { ids: [], secrets: [] };
const options = {
  baseURL: base,
  basePath: "/api/auth",
  secret: "bench-secret-not-secret-bench-secret-not-secret",
  database: new pg.Pool({ connectionString: url, max: 10 }),
  emailAndPassword: { enabled: true },
  rateLimit: { enabled: false },
  telemetry: { enabled: false },
  plugins: [
    admin(),
    jwt({ jwks: { keyPairConfig: { alg: "RS256", modulusLength: 2048 } } }),
    oauthProvider({
      loginPage: "/sign-in", consentPage: "/consent",
      generateClientId: () => chosen.ids.shift(), generateClientSecret: () => chosen.secrets.shift(),
    }),
  ],
};
const auth = betterAuth(options);
await (await getMigrations(options)).runMigrations();
const ctx = await auth.$context;

await auth.api.signUpEmail({ body: { email: "alice@example.com", password: "alice-password", name: "Alice" } });
const owner = await auth.api.signUpEmail({
  body: { email: "admin@example.com", password: "admin-password-bench", name: "Admin" },
});
await ctx.internalAdapter.updateUser(owner.user.id, { role: "admin" });
const { headers } = await auth.api.signInEmail({
  body: { email: "admin@example.com", password: "admin-password-bench" }, returnHeaders: true,
});
const adminHeaders = new Headers({ cookie: headers.getSetCookie().map((c) => c.split(";")[0]).join("; ") });
for (const [id, secret, redirects] of [
  ["demo-app", "demo-app-secret", ["http://127.0.0.1:9000/callback"]],
  ["api-gateway", "api-gateway-secret", ["http://127.0.0.1:9000/unused"]],
]) {
  chosen.ids.push(id);
  chosen.secrets.push(secret);
  await auth.api.adminCreateOAuthClient({
    body: {
      client_name: id, redirect_uris: redirects, skip_consent: true, application_type: "native",
      grant_types: ["authorization_code", "refresh_token"], response_types: ["code"],
      token_endpoint_auth_method: "client_secret_basic",
    },
    headers: adminHeaders,
  });
}

const handler = toNodeHandler(auth);
http.createServer((request, response) => {
  if (request.url === "/readyz") {
    response.end("ok");
    return;
  }
  handler(request, response);
}).listen(port, "127.0.0.1");
