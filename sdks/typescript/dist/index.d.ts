import { type Client as FetchClient } from "openapi-fetch";
import type { components, operations, paths } from "./schema.js";
export type { components, operations, paths };
export type Agent = components["schemas"]["Agent"];
export type Artifact = components["schemas"]["Artifact"];
export type Connection = components["schemas"]["Connection"];
export type EgressRecord = components["schemas"]["EgressRecord"];
export type AuditRecord = components["schemas"]["AuditRecord"];
export type Event = components["schemas"]["Event"];
export type Run = components["schemas"]["Run"];
export type RunLimits = components["schemas"]["RunLimits"];
export type ConnectionType = components["schemas"]["NewConnection"]["type"];
/** An agent directory's manifest, as `airlock run -f` reads it. */
export declare const MANIFEST = "airlock.toml";
/** The API refused a call: its HTTP status and its `error` body. */
export declare class AirlockError extends Error {
    readonly status: number;
    readonly code: string;
    constructor(status: number, code: string, message: string);
}
/**
 * One event of a run's stream: `event` is its kind (`log`, `result`, …; `end`
 * last), `id` its store id (`null` for `end`), `data` the decoded JSON: an
 * `Event`, or for `end` the run as it ended.
 */
export interface StreamEvent {
    event: string;
    id: number | null;
    data: unknown;
}
export interface ClientOptions {
    /** Attempts in a row that bring nothing new before a stream gives up (5). */
    reconnects?: number;
}
/**
 * The HTTP status each of the API's error codes is answered with: what an
 * error that arrives inside a stream (an SSE `error` event, on a stream
 * answered 200) is thrown with.
 */
export declare const STATUS_OF_CODE: Readonly<Record<string, number>>;
export declare class Agents {
    private readonly api;
    constructor(api: FetchClient<paths>);
    /**
     * Registers the agent of a directory (its `airlock.toml` and its files),
     * under the name its manifest gives; registering again replaces it.
     */
    register(directory: string): Promise<Agent>;
}
export declare class Runs {
    private readonly api;
    private readonly reconnects;
    private readonly baseUrl;
    constructor(api: FetchClient<paths>, reconnects: number, baseUrl: string);
    /**
     * Queues a run of a registered agent. `files`: input files, relative path
     * in the agent's workspace → UTF-8 text (a string or its bytes), placed
     * there before the agent starts.
     */
    create(agent: string, prompt?: string, options?: {
        limits?: RunLimits;
        files?: Record<string, string | Uint8Array>;
    }): Promise<Run>;
    /**
     * The files the run's agent left in its output directory (`agent.outputs`):
     * each stored one with a short-lived download URL, each refused one with
     * the reason (`refused`).
     */
    artifacts(id: string): Promise<Artifact[]>;
    /**
     * One artifact's bytes, through a freshly signed URL (which needs no key
     * while it lasts). 404 `not_found` if the run left no stored artifact at
     * `path` (a refused one has none).
     */
    download(id: string, path: string): Promise<Uint8Array>;
    get(id: string): Promise<Run>;
    /**
     * The run's events as they come (every event but heartbeats), ending with
     * `end`, which carries the run as it ended. A dropped connection, a replica
     * that shuts down (`error` with code `unavailable`) or a `503` is
     * reconnected with `Last-Event-ID`: no event is lost or repeated. Up to `reconnects`
     * attempts in a row that bring nothing new are made, 0.2 s apart and
     * doubling, before the error is thrown.
     */
    stream(id: string, lastEventId?: number): AsyncGenerator<StreamEvent>;
    private streamOnce;
    /** Follows the run's stream to its end; the run as it ended. */
    wait(id: string): Promise<Run>;
    /** The result the run reported last (JSON); 404 if it reported none. */
    result(id: string): Promise<unknown>;
    /** Every request that left the run's sandbox, and its refusals. */
    egress(id: string, limit?: number): Promise<EgressRecord[]>;
    /**
     * Every decision made for the run (`AuditRecord`s, docs/audit.md), oldest
     * first, read line by line as the server streams them; with `"ocsf"` the
     * network decisions as OCSF events.
     */
    audit(id: string, format?: "airlock" | "ocsf"): AsyncGenerator<AuditRecord | Record<string, unknown>>;
    /** Cancels a queued or running run (409 if it has ended). */
    cancel(id: string): Promise<Run>;
}
export declare class Connections {
    private readonly api;
    constructor(api: FetchClient<paths>);
    /**
     * Stores a credential under `name`: creates it, or rotates the secret of
     * the connection of that name (whose integration and type must be these).
     * Write-only: the answer never holds the secret.
     */
    put(name: string, c: {
        integration: string;
        type: ConnectionType;
        fields: Record<string, string>;
    }): Promise<Connection>;
}
/** A client of `airlock serve`: `new Client("http://127.0.0.1:8420", "alk_…")`. */
export declare class Client {
    /** openapi-fetch's client of every route, authenticated with the key. */
    readonly api: FetchClient<paths>;
    readonly agents: Agents;
    readonly runs: Runs;
    readonly connections: Connections;
    constructor(baseUrl: string, apiKey: string, options?: ClientOptions);
}
