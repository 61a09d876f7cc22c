// Baseline: Pyodide in Node, from the same embedded-asset files. Prints JSON timings in
// milliseconds: process start → first `print(1)` result, and the median of 50 tiny runs; and the
// process's proportional set size once they ran (KiB, from /proc/self/smaps_rollup).
//
//   node node_baseline.js ASSETS START_MS                 plain boot
//   node node_baseline.js ASSETS START_MS --make FILE     plain boot, then write a memory snapshot
//   node node_baseline.js ASSETS START_MS --load FILE     boot from that snapshot (Pyodide's own
//                                                         `_loadSnapshot`, the fastest Node start)
const fs = require("fs");
const path = require("path");
const t0 = Number(process.argv[3]);
const dir = path.resolve(process.argv[2]) + "/";
const mode = process.argv[4];
const file = process.argv[5];
const { loadPyodide } = require(dir + "pyodide.js");
(async () => {
  let out = [];
  const options = { indexURL: dir, stdout: (l) => out.push(l) };
  if (mode === "--make") options._makeSnapshot = true;
  if (mode === "--load") options._loadSnapshot = fs.readFileSync(file);
  const py = await loadPyodide(options);
  if (mode === "--make") {
    fs.writeFileSync(file, py.makeMemorySnapshot());
  }
  py.runPython("print(1)");
  const cold = Date.now() - t0;
  const times = [];
  for (let i = 0; i < 50; i++) {
    const s = process.hrtime.bigint();
    py.runPython("print(1)");
    times.push(Number(process.hrtime.bigint() - s) / 1e6);
  }
  times.sort((a, b) => a - b);
  let pssKib = null;
  try {
    const rollup = fs.readFileSync("/proc/self/smaps_rollup", "utf8");
    const line = rollup.split("\n").find((l) => l.startsWith("Pss:"));
    pssKib = line ? Number(line.split(/\s+/)[1]) : null;
  } catch (e) {
    pssKib = null;
  }
  console.log(JSON.stringify({ cold_ms: cold, warm_median_ms: times[25], pss_kib: pssKib, out: out.length }));
})();
