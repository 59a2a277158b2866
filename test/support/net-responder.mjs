// A test host's servers, run inside the test's network namespace (`ip netns exec ... node
// net-responder.mjs ...`): raw TCP ports that answer `hello from <address>:<port>` and close;
// HTTP and HTTPS ports (HTTPS with the certificate and key files the test made); and optionally a
// DNS server (UDP and TCP port 53) that answers A queries for names under `.test.` with one fixed
// address and anything else with NXDOMAIN. It prints `ready` once listening.
//
// HTTP(S) paths:
//   /             `hello from <address>:<port>` (as the raw TCP ports say it)
//   /headers      the request's headers as JSON (Node's view: names lower-cased, repeats joined)
//   /bytes?n=N    N bytes (0 <= N <= 1 GiB), streamed with Content-Length; byte i is i mod 256
//
//   node net-responder.mjs --address 172.16.9.10 [--tcp 80,7771] [--http 8080]
//        [--https 443,8443 --cert cert.pem --key key.pem] [--dns 203.0.113.9]
import { createSocket } from 'node:dgram';
import { readFileSync } from 'node:fs';
import { createServer as createHttpServer } from 'node:http';
import { createServer as createHttpsServer } from 'node:https';
import { createServer } from 'node:net';

const args = process.argv.slice(2);
const opt = (name) => {
  const i = args.indexOf(`--${name}`);
  return i >= 0 ? args[i + 1] : undefined;
};
const ports = (name) => (opt(name) ?? '').split(',').filter(Boolean).map(Number);
const address = opt('address');
const tcpPorts = ports('tcp');
const httpPorts = ports('http');
const httpsPorts = ports('https');
const dnsAnswer = opt('dns');
if (!address) throw new Error('--address is required');
if (httpsPorts.length && (!opt('cert') || !opt('key'))) throw new Error('--https needs --cert and --key');

const listening = [];
for (const port of tcpPorts) {
  const server = createServer((socket) => {
    socket.on('error', () => undefined);
    socket.end(`hello from ${address}:${port}\n`);
  });
  listening.push(new Promise((resolve) => server.listen(port, address, resolve)));
}

const MAX_BYTES = 2 ** 30;
// 64 KiB of the i mod 256 pattern: whole periods, so consecutive chunks continue it.
const CHUNK = Buffer.from(Array.from({ length: 65536 }, (_, i) => i % 256));

/** Writes n pattern bytes, waiting whenever the socket's buffer is full; stops if the client goes. */
async function sendBytes(res, n) {
  res.writeHead(200, { 'content-type': 'application/octet-stream', 'content-length': String(n) });
  let left = n;
  while (left > 0 && !res.destroyed) {
    const piece = left >= CHUNK.length ? CHUNK : CHUNK.subarray(0, left);
    left -= piece.length;
    if (!res.write(piece)) {
      await new Promise((resolve) => {
        res.once('drain', resolve);
        res.once('close', resolve);
      });
    }
  }
  res.end();
}

function handler(port) {
  return (req, res) => {
    req.resume();
    res.on('error', () => undefined);
    const url = new URL(req.url ?? '/', 'http://test-host');
    if (url.pathname === '/') {
      res.writeHead(200, { 'content-type': 'text/plain' });
      res.end(`hello from ${address}:${port}\n`);
    } else if (url.pathname === '/headers') {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(`${JSON.stringify(req.headers)}\n`);
    } else if (url.pathname === '/bytes') {
      const n = Number(url.searchParams.get('n'));
      if (!Number.isInteger(n) || n < 0 || n > MAX_BYTES) {
        res.writeHead(400, { 'content-type': 'text/plain' });
        res.end(`n must be an integer from 0 to ${MAX_BYTES}\n`);
        return;
      }
      void sendBytes(res, n);
    } else {
      res.writeHead(404, { 'content-type': 'text/plain' });
      res.end('not found\n');
    }
  };
}

for (const port of httpPorts) {
  const server = createHttpServer(handler(port));
  listening.push(new Promise((resolve) => server.listen(port, address, resolve)));
}
if (httpsPorts.length) {
  const tls = { cert: readFileSync(opt('cert')), key: readFileSync(opt('key')) };
  for (const port of httpsPorts) {
    const server = createHttpsServer(tls, handler(port));
    // A client that gives up mid-handshake (a refused certificate) is no error of the host's.
    server.on('tlsClientError', () => undefined);
    listening.push(new Promise((resolve) => server.listen(port, address, resolve)));
  }
}

/** The answer to one DNS query message (RFC 1035): the question echoed, one A record or NXDOMAIN. */
function answer(query) {
  if (query.length < 12) return undefined;
  let offset = 12;
  const labels = [];
  while (offset < query.length && query[offset] !== 0) {
    const len = query[offset];
    labels.push(query.subarray(offset + 1, offset + 1 + len).toString('ascii'));
    offset += len + 1;
  }
  const questionEnd = offset + 5; // zero byte, QTYPE, QCLASS
  if (questionEnd > query.length) return undefined;
  const qtype = query.readUInt16BE(offset + 1);
  const name = labels.join('.').toLowerCase();
  const found = dnsAnswer && name.endsWith('.test') && qtype === 1;
  const header = Buffer.alloc(12);
  query.copy(header, 0, 0, 2); // id
  header.writeUInt16BE(0x8180 | (found ? 0 : 3), 2); // response, recursion desired+available, NOERROR or NXDOMAIN
  header.writeUInt16BE(1, 4); // one question
  header.writeUInt16BE(found ? 1 : 0, 6); // answers
  const question = query.subarray(12, questionEnd);
  if (!found) return Buffer.concat([header, question]);
  const record = Buffer.alloc(16);
  record.writeUInt16BE(0xc00c, 0); // name: pointer to the question
  record.writeUInt16BE(1, 2); // A
  record.writeUInt16BE(1, 4); // IN
  record.writeUInt32BE(30, 6); // TTL
  record.writeUInt16BE(4, 10);
  dnsAnswer.split('.').forEach((octet, i) => record.writeUInt8(Number(octet), 12 + i));
  return Buffer.concat([header, question, record]);
}

if (dnsAnswer) {
  const udp = createSocket('udp4');
  udp.on('message', (msg, peer) => {
    const reply = answer(msg);
    if (reply) udp.send(reply, peer.port, peer.address);
  });
  listening.push(new Promise((resolve) => udp.bind(53, address, resolve)));
  // DNS over TCP: each message is prefixed with its length.
  const tcp = createServer((socket) => {
    socket.on('error', () => undefined);
    let buffered = Buffer.alloc(0);
    socket.on('data', (chunk) => {
      buffered = Buffer.concat([buffered, chunk]);
      while (buffered.length >= 2 && buffered.length >= 2 + buffered.readUInt16BE(0)) {
        const reply = answer(buffered.subarray(2, 2 + buffered.readUInt16BE(0)));
        buffered = buffered.subarray(2 + buffered.readUInt16BE(0));
        if (reply) socket.write(Buffer.concat([Buffer.from([reply.length >> 8, reply.length & 255]), reply]));
      }
    });
  });
  listening.push(new Promise((resolve) => tcp.listen(53, address, resolve)));
}

await Promise.all(listening);
process.stdout.write('ready\n');
// The test kills this process; a lost parent must not leave it running for long.
setTimeout(() => process.exit(0), 15 * 60_000).unref();
process.stdin.on('end', () => process.exit(0));
process.stdin.resume();
