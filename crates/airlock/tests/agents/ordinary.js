// An ordinary Node agent: worker threads, files, a child process, timers,
// zlib and crypto, and an HTTP request through the run's proxy (to the
// test's server named in the prompt).
const fs = require("fs");
const os = require("os");
const path = require("path");
const http = require("http");
const zlib = require("zlib");
const crypto = require("crypto");
const { execFileSync } = require("child_process");
const { Worker } = require("worker_threads");

async function main() {
  const r = {};
  const target = fs.readFileSync(process.env.AIRLOCK_PROMPT_FILE, "utf8").trim();
  const workers = await Promise.all(
    [1, 2, 3, 4].map(
      (n) =>
        new Promise((resolve, reject) => {
          const w = new Worker(
            "const { parentPort, workerData } = require('worker_threads');" +
              "let x = 0; for (let i = 0; i < 1e6; i++) x += i % workerData;" +
              "parentPort.postMessage(x);",
            { eval: true, workerData: n + 1 }
          );
          w.on("message", resolve);
          w.on("error", reject);
        })
    )
  );
  r.threads = workers.length;
  const ws = process.env.AIRLOCK_WORKSPACE || "/workspace";
  const file = path.join(ws, "out.txt");
  await fs.promises.writeFile(file, "written");
  r.workspace_file = await fs.promises.readFile(file, "utf8");
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "agent-"));
  fs.writeFileSync(path.join(tmp, "a"), Buffer.alloc(100000));
  r.tmp_file = fs.statSync(path.join(tmp, "a")).size;
  r.subprocess = execFileSync("/bin/sh", ["-c", "echo $((6 * 7))"]).toString().trim();
  r.zlib = zlib.gunzipSync(zlib.gzipSync(Buffer.from("round trip"))).toString();
  r.crypto = crypto.createHash("sha256").update("x").digest("hex").slice(0, 8);
  await new Promise((ok) => setTimeout(ok, 10));
  const proxy = new URL(process.env.HTTP_PROXY);
  r.http = await new Promise((resolve, reject) => {
    const req = http.request(
      { host: proxy.hostname, port: proxy.port, path: `http://${target}/hello`, headers: { host: target } },
      (res) => {
        let body = "";
        res.on("data", (d) => (body += d));
        res.on("end", () => resolve([res.statusCode, body]));
      }
    );
    req.on("error", reject);
    req.setTimeout(30000, () => req.destroy(new Error("timeout")));
    req.end();
  });
  fs.writeFileSync(process.env.AIRLOCK_RESULT_FILE, JSON.stringify(r));
  console.log("RESULT " + JSON.stringify(r));
}
main().catch((e) => {
  console.error(e);
  process.exit(1);
});
