// The facade against a real `airlock serve` on the namespace backend, started
// by .ci/sdks: AIRLOCK_TEST_SERVER is its base URL, AIRLOCK_TEST_API_KEY an
// organization's key, AIRLOCK_TEST_AGENTS the test agents' directory. It runs
// as a user's code does: importing the package installed from its path.

import assert from "node:assert/strict";
import net from "node:net";
import { mkdir, mkdtemp, readFile, rm, symlink, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, test } from "node:test";

import { AirlockError, Client } from "@airlock/client";

const server = process.env.AIRLOCK_TEST_SERVER;
const key = process.env.AIRLOCK_TEST_API_KEY;
const agents = process.env.AIRLOCK_TEST_AGENTS;
if (!server || !key || !agents) {
  throw new Error("set AIRLOCK_TEST_SERVER, AIRLOCK_TEST_API_KEY and AIRLOCK_TEST_AGENTS (.ci/sdks does)");
}
const client = new Client(server, key);

/**
 * A loopback TCP relay to the server that cuts the first event stream after
 * relaying its first event, and records each stream request's `Last-Event-ID`
 * header (null when absent).
 */
function cuttingProxy() {
  const upstream = new URL(server);
  const streams = [];
  const sockets = new Set();
  let cut = false;
  const listener = net.createServer((down) => {
    const up = net.connect(Number(upstream.port), upstream.hostname);
    sockets.add(down).add(up);
    let head = "";
    let cutThis = null; // unknown until the request head is read
    let seen = "";
    const end = () => {
      down.destroy();
      up.destroy();
    };
    down.on("data", (chunk) => {
      up.write(chunk);
      if (cutThis !== null) return;
      head += chunk.toString("latin1");
      const at = head.indexOf("\r\n\r\n");
      if (at < 0) return;
      const headers = Object.fromEntries(
        head
          .slice(0, at)
          .split("\r\n")
          .slice(1)
          .map((h) => [h.slice(0, h.indexOf(":")).trim().toLowerCase(), h.slice(h.indexOf(":") + 1).trim()]),
      );
      cutThis = false;
      if (headers.accept === "text/event-stream") {
        streams.push(headers["last-event-id"] ?? null);
        cutThis = !cut;
        cut = true;
      }
    });
    up.on("data", (chunk) => {
      down.write(chunk);
      seen += chunk.toString("latin1");
      if (cutThis && seen.includes("\nid:")) end();
    });
    down.on("error", end).on("close", end);
    up.on("error", end).on("close", end);
  });
  return new Promise((resolve) =>
    listener.listen(0, "127.0.0.1", () =>
      resolve({
        url: `http://127.0.0.1:${listener.address().port}`,
        streams,
        close: () => {
          for (const s of sockets) s.destroy();
          listener.close();
        },
      }),
    ),
  );
}

let proxy;
before(async () => {
  proxy = await cuttingProxy();
});
after(() => proxy.close());

test("a run is created, streamed across a dropped connection, and reported", async () => {
  const agent = await client.agents.register(join(agents, "sdk-lines"));
  assert.equal(agent.name, "sdk-lines");
  assert.ok(agent.files.includes("agent.py") && !agent.files.includes("airlock.toml"), agent.files);
  const run = await client.runs.create("sdk-lines", "from typescript");
  assert.ok(["queued", "running"].includes(run.status), run.status);

  // Followed through a relay that cuts the first stream after its first
  // event: the facade reconnects with Last-Event-ID.
  const through = new Client(proxy.url, key);
  const events = [];
  for await (const ev of through.runs.stream(run.id)) events.push(ev);
  assert.ok(proxy.streams.length >= 2, JSON.stringify(proxy.streams));
  assert.equal(proxy.streams[0], null);
  const resumedFrom = Number(proxy.streams[1]);
  const ids = events.filter((e) => e.id !== null).map((e) => e.id);
  assert.ok(ids.includes(resumedFrom), `${resumedFrom} in ${ids}`);
  assert.deepEqual(ids, [...new Set(ids)].sort((a, b) => a - b), "an event lost order or came twice");
  // Every stored event came once, across the cut.
  const page = await client.api.GET("/v1/runs/{id}/events", {
    params: { path: { id: run.id }, query: { limit: 100 } },
  });
  assert.deepEqual(
    ids,
    page.data.events.map((e) => e.id),
  );
  const logs = events.filter((e) => e.event === "log").map((e) => JSON.stringify(e.data.payload));
  assert.ok(
    logs.some((l) => l.includes("line 9 from typescript")),
    logs.join("\n"),
  );
  const last = events.at(-1);
  assert.equal(last.event, "end");
  assert.equal(last.data.status, "succeeded", JSON.stringify(last.data));

  const ended = await client.runs.wait(run.id);
  assert.equal(ended.status, "succeeded");
  assert.equal(ended.exit_code, 0);
  const result = await client.runs.result(run.id);
  assert.equal(result.exit_code, 0, JSON.stringify(result));
  assert.deepEqual(result.result, { echo: "from typescript", refused: true });
  const egress = await client.runs.egress(run.id);
  assert.ok(
    egress.some((e) => e.decision === "refused" && e.host === "refused.test"),
    JSON.stringify(egress),
  );
  // The run's audit holds the same refusal, typed and versioned, and its
  // OCSF form the same as a network event.
  const audit = [];
  for await (const r of client.runs.audit(run.id)) audit.push(r);
  assert.ok(
    audit.some((r) => r.schema_version === 1 && r.decision === "refused" && r.host === "refused.test"),
    JSON.stringify(audit),
  );
  const ocsf = [];
  for await (const e of client.runs.audit(run.id, "ocsf")) ocsf.push(e);
  assert.ok(ocsf.length > 0 && ocsf.every((e) => e.category_uid === 4), JSON.stringify(ocsf));

  // An ended run cannot be cancelled.
  await assert.rejects(client.runs.cancel(run.id), (e) => e instanceof AirlockError && e.status === 409);
});

test("a running run is cancelled", async () => {
  await client.agents.register(join(agents, "sdk-sleeper"));
  const run = await client.runs.create("sdk-sleeper");
  for await (const ev of client.runs.stream(run.id)) {
    if (ev.event === "log") break;
  }
  await client.runs.cancel(run.id);
  const ended = await client.runs.wait(run.id);
  assert.equal(ended.status, "cancelled", JSON.stringify(ended));
  assert.match(ended.error ?? "", /cancelled through the API/);
});

test("a connection is written, never read back", async () => {
  const secret = "sdk-typescript-secret-0123456789abcdef";
  const rotated = "sdk-typescript-rotated-0123456789abcdef";
  const conn = await client.connections.put("sdk-typescript", {
    integration: "github",
    type: "bearer",
    fields: { token: secret },
  });
  assert.equal(conn.name, "sdk-typescript");
  const again = await client.connections.put("sdk-typescript", {
    integration: "github",
    type: "bearer",
    fields: { token: rotated },
  });
  assert.ok(again.updated_at >= conn.updated_at);
  const listed = await client.api.GET("/v1/connections", { parseAs: "text" });
  assert.equal(listed.response.status, 200);
  assert.ok(listed.data.includes("sdk-typescript"), listed.data);
  for (const s of [secret, rotated]) {
    assert.ok(!listed.data.includes(s), "the list shows a secret");
    assert.ok(!JSON.stringify([conn, again]).includes(s), "an answer shows a secret");
  }
  await assert.rejects(
    client.connections.put("sdk-typescript", { integration: "other", type: "bearer", fields: { token: "x" } }),
    (e) => e instanceof AirlockError && e.status === 409,
  );
});

test("an unknown agent is the API's error", async () => {
  await assert.rejects(
    client.runs.create("no-such-agent"),
    (e) => e instanceof AirlockError && e.status === 404 && e.code === "not_found",
  );
});

test("register sends what the CLI sends", async () => {
  const dir = await mkdtemp(join(tmpdir(), "sdk-files-"));
  try {
    const manifest = await readFile(join(agents, "sdk-lines", "airlock.toml"), "utf-8");
    await writeFile(join(dir, "airlock.toml"), manifest.replace("sdk-lines", "sdk-files"));
    await writeFile(join(dir, "agent.py"), "print('hi')\n");
    await mkdir(join(dir, "nested"));
    await writeFile(join(dir, "nested", "data.txt"), "data\n");
    await writeFile(join(dir, ".hidden"), "not sent\n");
    await symlink(join(dir, "agent.py"), join(dir, "link.py"));
    const agent = await client.agents.register(dir);
    assert.equal(agent.name, "sdk-files");
    assert.deepEqual([...agent.files].sort(), ["agent.py", "nested/data.txt"]);

    await writeFile(join(dir, "blob.bin"), Buffer.from([0xff, 0xfe, 0x00]));
    await assert.rejects(client.agents.register(dir), /UTF-8/);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});

test("input files reach the run and its artifacts come back", async () => {
  await client.agents.register(join(agents, "sdk-outputs"));
  const run = await client.runs.create("sdk-outputs", undefined, {
    files: { "in/note.txt": new TextEncoder().encode("from the typescript sdk") },
  });
  const ended = await client.runs.wait(run.id);
  assert.equal(ended.status, "succeeded", JSON.stringify(ended));
  const arts = Object.fromEntries((await client.runs.artifacts(run.id)).map((a) => [a.path, a]));
  assert.deepEqual(Object.keys(arts).sort(), ["leak", "note.txt"]);
  assert.equal(arts.leak.refused, "symlink");
  assert.equal(arts.leak.download_url, null);
  const body = await client.runs.download(run.id, "note.txt");
  assert.equal(new TextDecoder().decode(body), "FROM THE TYPESCRIPT SDK");
  await assert.rejects(client.runs.download(run.id, "leak"), (e) => e instanceof AirlockError && e.status === 404);
  // A path that leaves the workspace is refused before anything is queued.
  await assert.rejects(
    client.runs.create("sdk-outputs", undefined, { files: { "/etc/escape": "x" } }),
    (e) => e instanceof AirlockError && e.status === 422 && e.code === "invalid",
  );
});

test("an error inside a stream carries its own status", async () => {
  await client.agents.register(join(agents, "sdk-sleeper"));
  const run = await client.runs.create("sdk-sleeper");
  const made = await client.api.POST("/v1/api-keys", { body: { name: "sdk-stream-ts" } });
  const other = new Client(server, made.data.key, { reconnects: 0 });
  const events = other.runs.stream(run.id);
  for await (const ev of events) {
    if (ev.event === "log") break;
  }
  await client.api.DELETE("/v1/api-keys/{id}", { params: { path: { id: made.data.id } } });
  // The generator closed by the break above: a fresh stream on the revoked
  // key is refused at once; one already open gets the error event.
  const again = other.runs.stream(run.id);
  await assert.rejects(
    (async () => {
      for await (const _ of again) {
        // drained until the error
      }
    })(),
    (e) => e instanceof AirlockError && e.status === 401 && e.code === "unauthorized",
  );
  await client.runs.cancel(run.id);
});
