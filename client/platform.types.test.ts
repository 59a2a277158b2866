// Compile-time proof that ClusterBridgeExecutor is the platform's port with every method:
// `npx tsc -p tsconfig.json --noEmit` (npm run lint) fails if it stops being assignable to
// Required<SandboxExecutor> (our copy of the port's signatures, client/platform-port.ts).
// The test below only makes jest see a passing file; the check is the compiler's.
import { ClusterBridgeExecutor } from './platform.js';
import type { PlatformProcessHandle, SandboxExecutor } from './platform-port.js';
import { createBridgeClient } from './client.js';

const executor = new ClusterBridgeExecutor(createBridgeClient({ url: 'https://bridge.example', token: 't', fetch: async () => new Response('{}') }), { sessionId: 's' });
const port: Required<SandboxExecutor> = executor;
// What the platform gets back must be its own types too.
type Handle = Awaited<ReturnType<ClusterBridgeExecutor['startProcess']>>;
const handleFits = (h: Handle): PlatformProcessHandle => h;
// And a method missing from the executor would not compile: @ts-expect-error proves the check bites.
// @ts-expect-error an object without gitCheckout is not the full port
const partial: Required<SandboxExecutor> = { ...port, gitCheckout: undefined };

test('ClusterBridgeExecutor is assignable to Required<SandboxExecutor> (checked by tsc)', () => {
  expect(typeof port.exec).toBe('function');
  expect(typeof handleFits).toBe('function');
  expect(partial).toBeDefined();
});
