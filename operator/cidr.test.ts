import { contains, egressIpBlocks, formatCidr, parseCidr } from './cidr.js';

test('parses and formats IPv4 and IPv6 canonically', () => {
  expect(formatCidr(parseCidr('10.1.2.3/8'))).toBe('10.0.0.0/8');
  expect(formatCidr(parseCidr('0.0.0.0/0'))).toBe('0.0.0.0/0');
  expect(formatCidr(parseCidr('2001:db8:0:0:0:0:0:1/32'))).toBe('2001:db8::/32');
  expect(formatCidr(parseCidr('::/0'))).toBe('::/0');
  expect(formatCidr(parseCidr('fe80::1/128'))).toBe('fe80::1/128');
  expect(() => parseCidr('10.0.0.0')).toThrow(/invalid CIDR/);
  expect(() => parseCidr('10.0.0.0/33')).toThrow(/invalid CIDR/);
});

test('containment respects family and prefix', () => {
  expect(contains(parseCidr('0.0.0.0/0'), parseCidr('169.254.169.254/32'))).toBe(true);
  expect(contains(parseCidr('10.0.0.0/8'), parseCidr('11.0.0.0/16'))).toBe(false);
  expect(contains(parseCidr('::/0'), parseCidr('10.0.0.0/8'))).toBe(false);
  expect(contains(parseCidr('10.0.0.0/16'), parseCidr('10.0.0.0/8'))).toBe(false);
});

test('denied ranges become excepts of the allowed ranges that contain them', () => {
  expect(egressIpBlocks(['0.0.0.0/0'], ['169.254.169.254/32', '169.254.0.0/16', '10.0.0.0/8'])).toEqual([
    { cidr: '0.0.0.0/0', except: ['169.254.0.0/16', '10.0.0.0/8'] },
  ]);
  expect(egressIpBlocks(['10.0.0.0/8', '::/0'], ['10.1.0.0/16', 'fd00::/8', '192.168.0.0/16'])).toEqual([
    { cidr: '10.0.0.0/8', except: ['10.1.0.0/16'] },
    { cidr: '::/0', except: ['fd00::/8'] },
  ]);
});

test('the most specific entry decides: an allowed range inside a denied one opens just that range', () => {
  expect(egressIpBlocks(['0.0.0.0/0', '10.1.2.3/32'], ['10.0.0.0/8'])).toEqual([
    { cidr: '0.0.0.0/0', except: ['10.0.0.0/8'] },
    { cidr: '10.1.2.3/32' },
  ]);
  // ... and a denied range inside that again closes its part of it.
  expect(egressIpBlocks(['0.0.0.0/0', '10.1.0.0/16'], ['10.0.0.0/8', '10.1.2.0/24'])).toEqual([
    { cidr: '0.0.0.0/0', except: ['10.0.0.0/8'] },
    { cidr: '10.1.0.0/16', except: ['10.1.2.0/24'] },
  ]);
});

test('a tie goes to deny', () => {
  expect(egressIpBlocks(['10.0.0.0/8', '8.8.8.8/32'], ['10.0.0.0/8'])).toEqual([{ cidr: '8.8.8.8/32' }]);
});
