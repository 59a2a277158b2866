import { BridgeError } from './errors.js';
import { EnvSealer } from './env-seal.js';

const key = 'k'.repeat(40);
const other = 'o'.repeat(40);

test('sealed env opens under the same key and snapshot id, and is not in clear', () => {
  const sealer = new EnvSealer([key]);
  const sealed = sealer.seal({ API_TOKEN: 'very-secret-value', EMPTY: '' }, 'snap-a');
  expect(JSON.stringify(sealed)).not.toContain('very-secret-value');
  expect(JSON.stringify(sealed)).not.toContain('API_TOKEN');
  expect(sealer.open(sealed, 'snap-a')).toEqual({ API_TOKEN: 'very-secret-value', EMPTY: '' });
  // A fresh IV each time.
  expect(sealer.seal({ A: 'b' }, 'snap-a').iv).not.toBe(sealer.seal({ A: 'b' }, 'snap-a').iv);
});

test('a sealed env moved to another snapshot, or altered, does not open', () => {
  const sealer = new EnvSealer([key]);
  const sealed = sealer.seal({ A: 'b' }, 'snap-a');
  expect(() => sealer.open(sealed, 'snap-b')).toThrow(BridgeError);
  const data = Buffer.from(sealed.data, 'base64');
  data[0]! ^= 1;
  expect(() => sealer.open({ ...sealed, data: data.toString('base64') }, 'snap-a')).toThrow(/does not authenticate/);
});

test('rotation: the first key seals, older keys still open what they sealed; an unknown key is named', () => {
  const old = new EnvSealer([other]).seal({ A: 'old' }, 'snap-a');
  const rotated = new EnvSealer([key, other]);
  expect(rotated.open(old, 'snap-a')).toEqual({ A: 'old' });
  expect(rotated.seal({ A: 'new' }, 'snap-b').kid).toBe(new EnvSealer([key]).seal({}, 'x').kid);
  expect(() => new EnvSealer([key]).open(old, 'snap-a')).toThrow(/key this bridge does not have/);
});
