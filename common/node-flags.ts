// V8 flags the bridge and the operator run with. The image's ENTRYPOINT passes the same (a
// Dockerfile test checks) and whatever starts them here (npm run dev, the benches, the tests)
// uses this list, so what is measured is what ships. They cannot go into NODE_OPTIONS.
//
// --optimize-for-size: both programs are I/O-bound and their heap is mostly a watch cache plus
// the API client's code; V8's default young generation and heap growth left most of the RSS as
// free heap. Measured with 10,000 boxes (bridge, same build, one after the other): RSS ~320 MiB
// -> ~153 MiB, no visible change in exec or list latency (bench/results/bridge.md).
export const NODE_FLAGS: readonly string[] = ['--optimize-for-size'];
