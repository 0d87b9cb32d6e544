// Full browser sign-ins, as many as CONCURRENCY virtual browsers finish in
// DURATION seconds: authorize, the login form, the redirect with a code, the
// code exchange; each sign-in with a fresh cookie jar. Prints one JSON line.
// Usage: node login-driver.mjs '{"authorize": URL, "token": URL, "client_id", "client_secret",
//   "redirect_uri", "username", "password", "concurrency", "duration", "limit"}'
import { createHash, randomBytes } from 'node:crypto';

const o = JSON.parse(process.argv[2]);
const b64url = (buf) => buf.toString('base64url');

async function step(jar, url, init = {}) {
  const headers = { ...(init.headers || {}) };
  if (jar.size) headers.cookie = [...jar].map(([k, v]) => `${k}=${v}`).join('; ');
  const res = await fetch(url, { ...init, headers, redirect: 'manual' });
  for (const cookie of res.headers.getSetCookie()) {
    const [pair] = cookie.split(';');
    const i = pair.indexOf('=');
    jar.set(pair.slice(0, i).trim(), pair.slice(i + 1).trim());
  }
  return res;
}

function loginForm(html, base) {
  const form = [...html.matchAll(/<form\b([^>]*)>([\s\S]*?)<\/form>/gi)].find((m) => /name="password"/.test(m[2]));
  if (!form) throw new Error('no login form');
  const action = (/action="([^"]*)"/.exec(form[1]) || [])[1] || base;
  const fields = new URLSearchParams();
  for (const input of form[2].matchAll(/<input\b([^>]*)>/gi)) {
    if (!/type="hidden"/.test(input[1])) continue;
    const name = /name="([^"]*)"/.exec(input[1]);
    const value = /value="([^"]*)"/.exec(input[1]);
    if (name) fields.set(name[1], (value ? value[1] : '').replace(/&amp;/g, '&').replace(/&#34;|&quot;/g, '"'));
  }
  fields.set('username', o.username);
  fields.set('password', o.password);
  return [new URL(action.replace(/&amp;/g, '&'), base).href, fields];
}

async function signIn() {
  const jar = new Map();
  const verifier = b64url(randomBytes(32));
  const challenge = b64url(createHash('sha256').update(verifier).digest());
  const params = new URLSearchParams({ response_type: 'code', client_id: o.client_id, redirect_uri: o.redirect_uri,
    scope: 'openid profile email', state: 'bench', code_challenge: challenge, code_challenge_method: 'S256' });
  let url = `${o.authorize}?${params}`;
  let res = await step(jar, url);
  let posted = false;
  for (let hops = 0; hops < 10; hops += 1) {
    if (res.status >= 300 && res.status < 400) {
      const location = new URL(res.headers.get('location'), url).href;
      if (location.startsWith(o.redirect_uri)) {
        const code = new URL(location).searchParams.get('code');
        const token = await fetch(o.token, { method: 'POST', headers: {
          'content-type': 'application/x-www-form-urlencoded',
          authorization: `Basic ${Buffer.from(`${o.client_id}:${o.client_secret}`).toString('base64')}` },
        body: new URLSearchParams({ grant_type: 'authorization_code', code, redirect_uri: o.redirect_uri, code_verifier: verifier }) });
        const answer = await token.json();
        if (!answer.id_token) throw new Error(`token endpoint: ${JSON.stringify(answer)}`);
        return;
      }
      url = location;
      res = await step(jar, url);
    } else if (res.status === 200 && !posted) {
      const [action, fields] = loginForm(await res.text(), url);
      posted = true;
      url = action;
      res = await step(jar, action, { method: 'POST', body: fields,
        headers: { 'content-type': 'application/x-www-form-urlencoded', origin: new URL(action).origin } });
    } else {
      throw new Error(`unexpected ${res.status} at ${url}: ${(await res.text()).replace(/<[^>]*>/g, ' ').replace(/\s+/g, ' ').slice(0, 400)}`);
    }
  }
  throw new Error('too many redirects');
}

const latencies = [];
let errors = 0;
let firstError = null;
const end = Date.now() + o.duration * 1000;
async function browser() {
  while (Date.now() < end && latencies.length < (o.limit || Infinity)) {
    const start = process.hrtime.bigint();
    try {
      await signIn();
      latencies.push(Number(process.hrtime.bigint() - start) / 1e6);
    } catch (e) {
      errors += 1;
      firstError ??= String(e);
      if (errors > 20) return;
    }
  }
}
const started = Date.now();
await Promise.all(Array.from({ length: o.concurrency }, browser));
const seconds = (Date.now() - started) / 1000;
latencies.sort((a, b) => a - b);
const at = (q) => latencies.length ? latencies[Math.min(latencies.length - 1, Math.floor(q * latencies.length))] : null;
console.log(JSON.stringify({ count: latencies.length, seconds, rate: latencies.length / seconds, p50: at(0.5), p99: at(0.99), errors, firstError }));
