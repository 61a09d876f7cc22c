// Baseline: plain Pyodide in Node, from the same embedded-asset files. Prints JSON timings in
// milliseconds: process start → first `print(1)` result, and the median of 50 tiny runs.
const path = require("path");
const t0 = Number(process.argv[3]);
const dir = path.resolve(process.argv[2]) + "/";
const { loadPyodide } = require(dir + "pyodide.js");
(async () => {
  let out = [];
  const py = await loadPyodide({ indexURL: dir, stdout: (l) => out.push(l) });
  py.runPython("print(1)");
  const cold = Date.now() - t0;
  const times = [];
  for (let i = 0; i < 50; i++) {
    const s = process.hrtime.bigint();
    py.runPython("print(1)");
    times.push(Number(process.hrtime.bigint() - s) / 1e6);
  }
  times.sort((a, b) => a - b);
  console.log(JSON.stringify({ cold_ms: cold, warm_median_ms: times[25], out: out.length }));
})();
