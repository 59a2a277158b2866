// A platform's credential resolver, as a test host runs it in its network namespace
// (`ip netns exec ... node egress-resolver.mjs ...`): the egress gateway POSTs
// {box_id, pool, host, port, tenant_id, session_id} signed with X-Sandbox-Bridge-Signature
// (`t=<unix>,v1=<hex HMAC-SHA256(key, "<t>.<body>")>`, docs/egress.md); it checks the signature
// and the timestamp (5 min) and answers {"headers": ..., "ttl_seconds"} from the answers file
// ({"<host>": {"headers": {...}, "ttl_seconds": n}}, re-read on every request so a test can change
// it), or 204 for a host it has nothing for, or 401 for a bad signature. Every request seen (the
// body, and whether its signature verified) is appended to the log file as a JSON line, for the
// test to count (the test's process cannot reach into the namespace). Prints `ready`.
//
//   node egress-resolver.mjs --address 203.0.113.20 --port 8080 --key-file KEY --answers FILE --log FILE
import { createHmac, timingSafeEqual } from 'node:crypto';
import { appendFileSync, readFileSync } from 'node:fs';
import { createServer } from 'node:http';

const args = process.argv.slice(2);
const opt = (name) => {
  const i = args.indexOf(`--${name}`);
  return i >= 0 ? args[i + 1] : undefined;
};
const address = opt('address');
const port = Number(opt('port') ?? 8080);
const key = readFileSync(opt('key-file'), 'utf8').split('\n').map((l) => l.trim()).find(Boolean);
const answersFile = opt('answers');
const logFile = opt('log');
if (!address || !key || !answersFile || !logFile) throw new Error('--address, --key-file, --answers and --log are required');

function verified(header, body) {
  const m = /^t=(\d+),v1=([0-9a-f]{64})$/.exec(header ?? '');
  if (!m) return false;
  if (Math.abs(Date.now() / 1000 - Number(m[1])) > 300) return false;
  const want = createHmac('sha256', key).update(`${m[1]}.${body}`).digest();
  return timingSafeEqual(want, Buffer.from(m[2], 'hex'));
}

const server = createServer((req, res) => {
  const chunks = [];
  req.on('data', (c) => chunks.push(c));
  req.on('end', () => {
    const body = Buffer.concat(chunks).toString('utf8');
    const ok = verified(req.headers['x-sandbox-bridge-signature'], body);
    let doc;
    try {
      doc = JSON.parse(body);
    } catch {
      doc = undefined;
    }
    appendFileSync(logFile, `${JSON.stringify({ at: Date.now(), verified: ok, body: doc ?? body })}\n`);
    if (!ok) {
      res.writeHead(401).end();
      return;
    }
    const answers = JSON.parse(readFileSync(answersFile, 'utf8'));
    const answer = doc && answers[doc.host];
    if (!answer) {
      res.writeHead(204).end();
      return;
    }
    res.writeHead(200, { 'content-type': 'application/json' });
    res.end(JSON.stringify(answer));
  });
});
server.listen(port, address, () => process.stdout.write('ready\n'));
