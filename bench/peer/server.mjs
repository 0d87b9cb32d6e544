// node-oidc-provider in its fastest configuration (everything in memory,
// plain-text password comparison), with the clients and user of authsrv's
// demo, for bench/bench.py. Usage: node server.mjs PORT
import { generateKeyPairSync } from 'node:crypto';
import http from 'node:http';
import Provider from 'oidc-provider';

const port = Number(process.argv[2]);
const issuer = `http://127.0.0.1:${port}`;
const USERS = { alice: { password: 'alice-password', sub: 'sub-alice', name: 'Alice', email: 'alice@example.com' } };
const RESOURCE = 'https://api.demo.test';

const { privateKey } = generateKeyPairSync('rsa', { modulusLength: 2048 });
const signing = { ...privateKey.export({ format: 'jwk' }), kid: 'bench-rs256', use: 'sig', alg: 'RS256' };

// The package's own memory adapter keeps only the last 1,000 entries (it is
// meant for trying things out): a run would lose its session and grant. This
// one is a plain Map, as fast, and keeps everything until it expires.
const store = new Map();
const grants = new Map();
class MemoryAdapter {
  constructor(model) { this.model = model; }

  key(id) { return `${this.model}:${id}`; }

  async upsert(id, payload, expiresIn) {
    const key = this.key(id);
    store.set(key, { payload, expiresAt: expiresIn ? Date.now() + expiresIn * 1000 : Infinity });
    if (payload.grantId) {
      if (!grants.has(payload.grantId)) grants.set(payload.grantId, new Set());
      grants.get(payload.grantId).add(key);
    }
    if (payload.uid) store.set(`uid:${payload.uid}`, { payload: id, expiresAt: Infinity });
    if (payload.userCode) store.set(`userCode:${payload.userCode}`, { payload: id, expiresAt: Infinity });
  }

  async find(id) {
    const entry = store.get(this.key(id));
    if (!entry) return undefined;
    if (entry.expiresAt <= Date.now()) { store.delete(this.key(id)); return undefined; }
    return entry.payload;
  }

  async findByUid(uid) { const id = store.get(`uid:${uid}`); return id && this.find(id.payload); }

  async findByUserCode(code) { const id = store.get(`userCode:${code}`); return id && this.find(id.payload); }

  async consume(id) { const entry = store.get(this.key(id)); if (entry) entry.payload.consumed = Math.floor(Date.now() / 1000); }

  async destroy(id) { store.delete(this.key(id)); }

  async revokeByGrantId(grantId) {
    for (const key of grants.get(grantId) || []) store.delete(key);
    grants.delete(grantId);
  }
}

const provider = new Provider(issuer, {
  adapter: MemoryAdapter,
  clients: [
    {
      client_id: 'demo-app', client_secret: 'demo-app-secret',
      redirect_uris: ['http://127.0.0.1:9000/callback'],
      grant_types: ['authorization_code', 'refresh_token'], response_types: ['code'],
      token_endpoint_auth_method: 'client_secret_basic',
    },
    {
      client_id: 'api-gateway', client_secret: 'api-gateway-secret',
      redirect_uris: [], grant_types: [], response_types: [],
      token_endpoint_auth_method: 'client_secret_basic',
    },
  ],
  jwks: { keys: [signing] },
  cookies: { keys: ['bench-cookie-key-not-secret'] },
  scopes: ['openid', 'profile', 'email', 'offline_access'],
  claims: { openid: ['sub'], profile: ['name'], email: ['email', 'email_verified'] },
  findAccount: async (_ctx, sub) => {
    const user = Object.values(USERS).find((u) => u.sub === sub);
    return user && { accountId: sub, claims: async () => ({ sub, name: user.name, email: user.email, email_verified: true }) };
  },
  features: {
    devInteractions: { enabled: false },
    introspection: { enabled: true },
    revocation: { enabled: true },
    resourceIndicators: {
      enabled: true,
      defaultResource: () => undefined,
      useGrantedResource: () => false,
      getResourceServerInfo: (_ctx, resource) => {
        if (resource !== RESOURCE) throw new Error('unknown resource');
        return { scope: 'openid profile email', audience: RESOURCE, accessTokenFormat: 'jwt', accessTokenTTL: 3600 };
      },
    },
  },
  pkce: { required: () => true },
  // As authsrv: a refresh token for every client allowed the grant, rotated on every use.
  issueRefreshToken: async (_ctx, client) => client.grantTypeAllowed('refresh_token'),
  rotateRefreshToken: () => true,
  ttl: { AccessToken: 3600, AuthorizationCode: 60, IdToken: 3600, RefreshToken: 30 * 24 * 3600, Interaction: 600, Session: 3600 * 24, Grant: 30 * 24 * 3600 },
  interactions: { url: (_ctx, interaction) => `/interaction/${interaction.uid}` },
});
provider.proxy = false;

const escape = (s) => String(s).replace(/[&<>"]/g, (c) => `&#${c.charCodeAt(0)};`);

async function body(req) {
  const chunks = [];
  for await (const chunk of req) chunks.push(chunk);
  return new URLSearchParams(Buffer.concat(chunks).toString());
}

async function interaction(req, res) {
  const details = await provider.interactionDetails(req, res);
  if (req.method === 'GET') {
    res.writeHead(200, { 'content-type': 'text/html; charset=utf-8' });
    res.end(`<!doctype html><form method="post" action="/interaction/${escape(details.uid)}">`
      + '<input name="username"><input type="password" name="password"><button>Sign in</button></form>');
    return;
  }
  const form = await body(req);
  const user = USERS[form.get('username')];
  if (!user || user.password !== form.get('password')) {
    res.writeHead(401, { 'content-type': 'text/plain' });
    res.end('wrong login or password');
    return;
  }
  // Consent given at once, as authsrv's first-party demo client does.
  const grant = (details.grantId && await provider.Grant.find(details.grantId))
    || new provider.Grant({ accountId: user.sub, clientId: details.params.client_id });
  grant.addOIDCScope(details.params.scope);
  if (details.params.resource) grant.addResourceScope(details.params.resource, details.params.scope);
  const grantId = await grant.save();
  await provider.interactionFinished(req, res, { login: { accountId: user.sub }, consent: { grantId } },
    { mergeWithLastSubmission: false });
}

const callback = provider.callback();
http.createServer((req, res) => {
  if (req.url.startsWith('/interaction/')) {
    interaction(req, res).catch((e) => { res.writeHead(500); res.end(String(e)); });
  } else {
    callback(req, res);
  }
}).listen(port, '127.0.0.1', () => console.log(`peer ready on ${issuer}`));
