// V8 flags the bridge and the operator run with. The image's ENTRYPOINT passes the same (a
// Dockerfile test checks) and whatever starts them here (npm run dev, the benches, the tests)
// uses this list, so what is measured is what ships. They cannot go into NODE_OPTIONS.
//
// --optimize-for-size: both programs hold a watch cache plus the API client's code, and V8's
// default young generation and heap growth left most of their RSS as free heap. It trades CPU
// for memory. Measured (same build, one after the other): bridge at 10,000 boxes RSS ~320 ->
// ~153 MiB (a one-off probe script, not a committed bench) with no visible change in exec or list latency; operator reaping 3,000 boxes peak RSS
// 314 -> 147 MiB but 9 -> 14 CPU-seconds and all deletes issued in 31 s instead of 22 s.
// (--max-semi-space-size=1 alone: 233 MiB, 11 s; adding --max-old-space-size=256: 159 MiB,
// 13 s, but a hard heap cap that a larger pool would hit.) The RSS targets need it.
export const NODE_FLAGS: readonly string[] = ['--optimize-for-size'];
