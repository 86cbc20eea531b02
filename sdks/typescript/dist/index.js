// The run-centric facade over the generated client: `schema.ts` is generated
// from the API's OpenAPI document by openapi-typescript (sdks/generate.sh) and
// `api` is openapi-fetch's client of it. Every call goes through a route of
// the document; a failure is thrown as an `AirlockError` with the API's
// `{"error": {"code", "message"}}` and the status. No call ever returns a
// connection's secret: the API has no route that answers it.
import { readdir, readFile } from "node:fs/promises";
import { join, relative, sep } from "node:path";
import { EventSourceParserStream } from "eventsource-parser/stream";
import createClient from "openapi-fetch";
/** An agent directory's manifest, as `airlock run -f` reads it. */
export const MANIFEST = "airlock.toml";
/** The API refused a call: its HTTP status and its `error` body. */
export class AirlockError extends Error {
    status;
    code;
    constructor(status, code, message) {
        super(`${status} ${code}: ${message}`);
        this.status = status;
        this.code = code;
        this.name = "AirlockError";
    }
}
/**
 * The HTTP status each of the API's error codes is answered with: what an
 * error that arrives inside a stream (an SSE `error` event, on a stream
 * answered 200) is thrown with.
 */
export const STATUS_OF_CODE = {
    bad_request: 400,
    unauthorized: 401,
    quota_exceeded: 403,
    signature_invalid: 403,
    signature_expired: 403,
    not_found: 404,
    conflict: 409,
    too_large: 413,
    unsupported_media_type: 415,
    invalid: 422,
    rate_limited: 429,
    queue_full: 429,
    internal: 500,
    unavailable: 503,
    storage_full: 507,
};
function errorOf(status, body) {
    const e = body?.error;
    if (e && typeof e.code === "string" && typeof e.message === "string") {
        return new AirlockError(status, e.code, e.message);
    }
    return new AirlockError(status, "unexpected", String(JSON.stringify(body) ?? "").slice(0, 200));
}
/** The answer of an openapi-fetch call, or its error thrown. */
function answer(r) {
    if (r.error !== undefined || r.data === undefined) {
        throw errorOf(r.response.status, r.error);
    }
    return r.data;
}
/**
 * The agent directory's files as the server takes them (as the CLI's
 * `--server` sends them): regular UTF-8 files, hidden ones and symbolic links
 * skipped, the manifest apart.
 */
async function agentFiles(root) {
    const files = {};
    const utf8 = new TextDecoder("utf-8", { fatal: true });
    const walk = async (dir) => {
        const entries = await readdir(dir, { withFileTypes: true });
        entries.sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
        for (const e of entries) {
            const path = join(dir, e.name);
            if (e.name.startsWith(".") || e.isSymbolicLink())
                continue;
            if (e.isDirectory()) {
                await walk(path);
            }
            else if (e.isFile() && path !== join(root, MANIFEST)) {
                const rel = relative(root, path).split(sep).join("/");
                try {
                    files[rel] = utf8.decode(await readFile(path));
                }
                catch (cause) {
                    throw new Error(`${path}: the server takes UTF-8 text files only`, { cause });
                }
            }
        }
    };
    await walk(root);
    return files;
}
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
/** A replica that shuts down ends its streams so: reconnect. */
class Unavailable extends Error {
    error;
    constructor(error) {
        super(error.message);
        this.error = error;
    }
}
export class Agents {
    api;
    constructor(api) {
        this.api = api;
    }
    /**
     * Registers the agent of a directory (its `airlock.toml` and its files),
     * under the name its manifest gives; registering again replaces it.
     */
    async register(directory) {
        const manifest = await readFile(join(directory, MANIFEST), "utf-8");
        const files = await agentFiles(directory);
        return answer(await this.api.POST("/v1/agents", { body: { manifest, files } }));
    }
}
export class Runs {
    api;
    reconnects;
    baseUrl;
    constructor(api, reconnects, baseUrl) {
        this.api = api;
        this.reconnects = reconnects;
        this.baseUrl = baseUrl;
    }
    /**
     * Queues a run of a registered agent. `files`: input files, relative path
     * in the agent's workspace → UTF-8 text (a string or its bytes), placed
     * there before the agent starts.
     */
    async create(agent, prompt, options = {}) {
        const body = { agent };
        if (prompt !== undefined)
            body.prompt = prompt;
        if (options.limits !== undefined)
            body.limits = options.limits;
        if (options.files !== undefined && Object.keys(options.files).length > 0) {
            const utf8 = new TextDecoder("utf-8", { fatal: true });
            body.files = Object.fromEntries(Object.entries(options.files).map(([rel, v]) => [rel, typeof v === "string" ? v : utf8.decode(v)]));
        }
        return answer(await this.api.POST("/v1/runs", { body }));
    }
    /**
     * The files the run's agent left in its output directory (`agent.outputs`):
     * each stored one with a short-lived download URL, each refused one with
     * the reason (`refused`).
     */
    async artifacts(id) {
        return answer(await this.api.GET("/v1/runs/{id}/artifacts", { params: { path: { id } } }))
            .artifacts;
    }
    /**
     * One artifact's bytes, through a freshly signed URL (which needs no key
     * while it lasts). 404 `not_found` if the run left no stored artifact at
     * `path` (a refused one has none).
     */
    async download(id, path) {
        const url = (await this.artifacts(id)).find((a) => a.path === path)?.download_url;
        if (typeof url !== "string") {
            throw new AirlockError(404, "not_found", `no stored artifact ${JSON.stringify(path)}`);
        }
        // The signed URL alone: the key is not sent with it.
        const r = await fetch(this.baseUrl + url);
        if (!r.ok)
            throw errorOf(r.status, await r.json().catch(() => undefined));
        return new Uint8Array(await r.arrayBuffer());
    }
    async get(id) {
        return answer(await this.api.GET("/v1/runs/{id}", { params: { path: { id } } }));
    }
    /**
     * The run's events as they come (every event but heartbeats), ending with
     * `end`, which carries the run as it ended. A dropped connection, a replica
     * that shuts down (`error` with code `unavailable`) or a `503` is
     * reconnected with `Last-Event-ID`: no event is lost or repeated. Up to `reconnects`
     * attempts in a row that bring nothing new are made, 0.2 s apart and
     * doubling, before the error is thrown.
     */
    async *stream(id, lastEventId) {
        let last = lastEventId;
        let failures = 0;
        for (;;) {
            let progressed = false;
            let cause = new Error("the stream closed before its end");
            try {
                for await (const ev of this.streamOnce(id, last)) {
                    progressed = true;
                    if (ev.id !== null)
                        last = ev.id;
                    yield ev;
                    if (ev.event === "end")
                        return;
                }
            }
            catch (e) {
                // A replica that is starting, or a store that does not answer,
                // passes; any other refusal is final.
                if (e instanceof AirlockError && e.status !== 503)
                    throw e;
                cause = e instanceof Unavailable ? e.error : e;
            }
            failures = progressed ? 0 : failures + 1;
            if (failures > this.reconnects)
                throw cause;
            await sleep(200 * 2 ** Math.max(failures - 1, 0));
        }
    }
    async *streamOnce(id, after) {
        const headers = { Accept: "text/event-stream" };
        if (after !== undefined)
            headers["Last-Event-ID"] = String(after);
        const r = await this.api.GET("/v1/runs/{id}/events", {
            params: { path: { id } },
            headers,
            parseAs: "stream",
        });
        if (!r.response.ok || !r.data) {
            throw errorOf(r.response.status, r.error ?? (await r.response.json().catch(() => undefined)));
        }
        const events = r.data.pipeThrough(new TextDecoderStream()).pipeThrough(new EventSourceParserStream());
        for await (const sse of events) {
            const data = sse.data ? JSON.parse(sse.data) : null;
            const event = sse.event ?? "message";
            if (event === "error") {
                const inStream = errorOf(200, data);
                const err = new AirlockError(STATUS_OF_CODE[inStream.code] ?? 500, inStream.code, inStream.message);
                if (err.code === "unavailable")
                    throw new Unavailable(err);
                throw err;
            }
            // The `end` event has no id of its own: only an event of the run has one.
            yield { event, id: event !== "end" && sse.id ? Number(sse.id) : null, data };
        }
    }
    /** Follows the run's stream to its end; the run as it ended. */
    async wait(id) {
        for await (const ev of this.stream(id)) {
            if (ev.event === "end")
                return ev.data;
        }
        throw new Error("stream() returns only after its end");
    }
    /** The result the run reported last (JSON); 404 if it reported none. */
    async result(id) {
        const r = await this.api.GET("/v1/runs/{id}/result", {
            params: { path: { id } },
            parseAs: "json",
        });
        if (!r.response.ok)
            throw errorOf(r.response.status, r.error);
        return r.data;
    }
    /** Every request that left the run's sandbox, and its refusals. */
    async egress(id, limit) {
        const query = limit === undefined ? {} : { limit };
        return answer(await this.api.GET("/v1/runs/{id}/egress", { params: { path: { id }, query } }))
            .egress;
    }
    /**
     * Every decision made for the run (`AuditRecord`s, docs/audit.md), oldest
     * first, read line by line as the server streams them; with `"ocsf"` the
     * network decisions as OCSF events.
     */
    async *audit(id, format) {
        const query = format === undefined ? {} : { format };
        const r = await this.api.GET("/v1/runs/{id}/audit.jsonl", {
            params: { path: { id }, query },
            parseAs: "stream",
        });
        if (!r.response.ok || !r.data) {
            throw errorOf(r.response.status, r.error ?? (await r.response.json().catch(() => undefined)));
        }
        let rest = "";
        for await (const chunk of r.data.pipeThrough(new TextDecoderStream())) {
            const lines = (rest + chunk).split("\n");
            rest = lines.pop() ?? "";
            for (const line of lines)
                if (line)
                    yield JSON.parse(line);
        }
        if (rest)
            yield JSON.parse(rest);
    }
    /** Cancels a queued or running run (409 if it has ended). */
    async cancel(id) {
        return answer(await this.api.POST("/v1/runs/{id}/cancel", { params: { path: { id } } }));
    }
}
export class Connections {
    api;
    constructor(api) {
        this.api = api;
    }
    /**
     * Stores a credential under `name`: creates it, or rotates the secret of
     * the connection of that name (whose integration and type must be these).
     * Write-only: the answer never holds the secret.
     */
    async put(name, c) {
        const created = await this.api.POST("/v1/connections", {
            body: { name, integration: c.integration, type: c.type, fields: c.fields },
        });
        if (created.response.status !== 409)
            return answer(created);
        // The name is taken: a rotation, of a connection of the same kind only.
        const path = { params: { path: { name } } };
        const have = answer(await this.api.GET("/v1/connections/{name}", path));
        if (have.integration !== c.integration || have.type !== c.type) {
            throw new AirlockError(409, "conflict", `connection ${JSON.stringify(name)} is of ${have.integration} (${have.type}), ` +
                `not ${c.integration} (${c.type}): delete it first`);
        }
        return answer(await this.api.PUT("/v1/connections/{name}", { ...path, body: { fields: c.fields } }));
    }
}
/** A client of `airlock serve`: `new Client("http://127.0.0.1:8420", "alk_…")`. */
export class Client {
    /** openapi-fetch's client of every route, authenticated with the key. */
    api;
    agents;
    runs;
    connections;
    constructor(baseUrl, apiKey, options = {}) {
        const base = baseUrl.replace(/\/+$/, "");
        this.api = createClient({
            baseUrl: base,
            headers: { Authorization: `Bearer ${apiKey}` },
        });
        this.agents = new Agents(this.api);
        this.runs = new Runs(this.api, options.reconnects ?? 5, base);
        this.connections = new Connections(this.api);
    }
}
