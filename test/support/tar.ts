// A minimal ustar writer, so tests can hand the bridge archives of their own making, including
// entries a well-behaved tar tool would never write (escapes, devices).

export interface TarEntry {
  name: string;
  body?: string | Buffer;
  /** A symlink to this target. */
  link?: string;
  /** A character device (0, 0). */
  device?: boolean;
  mode?: number;
}

export function tarOf(entries: TarEntry[]): Buffer {
  const blocks: Buffer[] = [];
  for (const e of entries) {
    const body = e.body === undefined ? Buffer.alloc(0) : Buffer.isBuffer(e.body) ? e.body : Buffer.from(e.body, 'utf8');
    const type = e.link !== undefined ? '2' : e.device ? '3' : '0';
    const header = Buffer.alloc(512);
    header.write(e.name.slice(0, 100), 0, 'utf8');
    header.write(octal(e.mode ?? (type === '2' ? 0o777 : 0o644), 8), 100);
    header.write(octal(65534, 8), 108);
    header.write(octal(65534, 8), 116);
    header.write(octal(type === '0' ? body.length : 0, 12), 124);
    header.write(octal(0, 12), 136);
    header.fill(' ', 148, 156); // checksum placeholder
    header.write(type, 156);
    if (e.link !== undefined) header.write(e.link, 157);
    header.write('ustar\u000000', 257, 'binary');
    if (e.device) {
      header.write(octal(0, 8), 329);
      header.write(octal(0, 8), 337);
    }
    let sum = 0;
    for (const byte of header) sum += byte;
    header.write(`${sum.toString(8).padStart(6, '0')}\0 `, 148);
    blocks.push(header);
    if (type === '0' && body.length) {
      blocks.push(body, Buffer.alloc((512 - (body.length % 512)) % 512));
    }
  }
  blocks.push(Buffer.alloc(1024));
  return Buffer.concat(blocks);
}

function octal(value: number, width: number): string {
  return `${value.toString(8).padStart(width - 1, '0')}\0`;
}
