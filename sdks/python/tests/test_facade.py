"""The facade against a real `airlock serve` on the namespace backend."""

import pytest
from airlock_client import AirlockError, Client
from airlock_client.generated.api.connections import list_connections
from airlock_client.generated.api.runs import stream_run_events
from conftest import AGENTS


def test_a_run_is_created_streamed_across_a_dropped_connection_and_reported(
    client, server, cutting_proxy
):
    agent = client.agents.register(AGENTS / "sdk-lines")
    assert agent.name == "sdk-lines"
    assert "agent.py" in agent.files and "airlock.toml" not in agent.files
    run = client.runs.create("sdk-lines", "from python")
    assert run.status in ("queued", "running")

    # Followed through a relay that cuts the first stream after its first
    # event: the facade reconnects with Last-Event-ID.
    with Client(cutting_proxy.url, server[1]) as through:
        events = list(through.runs.stream(run.id))
    assert len(cutting_proxy.streams) >= 2, cutting_proxy.streams
    assert cutting_proxy.streams[0] is None
    resumed_from = int(cutting_proxy.streams[1])
    ids = [e.id for e in events if e.id is not None]
    assert resumed_from in ids
    assert ids == sorted(set(ids)), f"an event lost order or came twice: {ids}"
    # Every stored event came once, across the cut.
    page = stream_run_events.sync(run.id, client=client.api, limit=100)
    assert ids == [e.id for e in page.events]
    logs = [e.data["payload"] for e in events if e.event == "log"]
    assert any("line 9 from python" in str(p) for p in logs), logs
    assert events[-1].event == "end"
    assert events[-1].data["status"] == "succeeded", events[-1].data

    ended = client.runs.wait(run.id)
    assert ended.status == "succeeded" and ended.exit_code == 0, ended
    result = client.runs.result(run.id)
    assert result["exit_code"] == 0, result
    assert result["result"] == {"echo": "from python", "refused": True}, result
    egress = client.runs.egress(run.id)
    refused = [
        e for e in egress if e.decision == "refused" and e.host == "refused.test"
    ]
    assert refused, egress
    # The run's audit holds the same refusal, typed and versioned, and its
    # OCSF form the same as a network event.
    audit = list(client.runs.audit(run.id))
    assert any(
        r["schema_version"] == 1
        and r["decision"] == "refused"
        and r["host"] == "refused.test"
        for r in audit
    ), audit
    ocsf = list(client.runs.audit(run.id, format="ocsf"))
    assert ocsf and all(e["category_uid"] == 4 for e in ocsf), ocsf

    # An ended run cannot be cancelled.
    with pytest.raises(AirlockError) as e:
        client.runs.cancel(run.id)
    assert e.value.status == 409


def test_a_running_run_is_cancelled(client):
    client.agents.register(AGENTS / "sdk-sleeper")
    run = client.runs.create("sdk-sleeper")
    for ev in client.runs.stream(run.id):
        if ev.event == "log":
            break
    client.runs.cancel(run.id)
    ended = client.runs.wait(run.id)
    assert ended.status == "cancelled", ended
    assert "cancelled through the API" in (ended.error or ""), ended


def test_a_connection_is_written_never_read_back(client):
    secret = "sdk-python-secret-0123456789abcdef"
    conn = client.connections.put(
        "sdk-python", integration="github", type="bearer", fields={"token": secret}
    )
    assert conn.name == "sdk-python"
    rotated = "sdk-python-rotated-0123456789abcdef"
    again = client.connections.put(
        "sdk-python", integration="github", type="bearer", fields={"token": rotated}
    )
    assert again.updated_at >= conn.updated_at
    listed = list_connections.sync_detailed(client=client.api)
    assert listed.status_code == 200
    assert "sdk-python" in listed.content.decode()
    for s in (secret, rotated):
        assert s not in listed.content.decode()
        assert s not in repr(again) and s not in repr(conn)
    with pytest.raises(AirlockError) as e:
        client.connections.put(
            "sdk-python", integration="other", type="bearer", fields={"token": "x"}
        )
    assert e.value.status == 409


def test_an_unknown_agent_is_the_apis_error(client):
    with pytest.raises(AirlockError) as e:
        client.runs.create("no-such-agent")
    assert e.value.status == 404 and e.value.code == "not_found"


def test_register_sends_what_the_cli_sends(client, tmp_path):
    (tmp_path / "airlock.toml").write_text(
        (AGENTS / "sdk-lines" / "airlock.toml")
        .read_text()
        .replace("sdk-lines", "sdk-files")
    )
    (tmp_path / "agent.py").write_text("print('hi')\n")
    (tmp_path / "nested").mkdir()
    (tmp_path / "nested" / "data.txt").write_text("data\n")
    (tmp_path / ".hidden").write_text("not sent\n")
    (tmp_path / "link.py").symlink_to(tmp_path / "agent.py")
    agent = client.agents.register(tmp_path)
    assert agent.name == "sdk-files"
    assert sorted(agent.files) == ["agent.py", "nested/data.txt"], agent.files

    (tmp_path / "blob.bin").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ValueError, match="UTF-8"):
        client.agents.register(tmp_path)


def test_input_files_reach_the_run_and_its_artifacts_come_back(client):
    client.agents.register(AGENTS / "sdk-outputs")
    run = client.runs.create(
        "sdk-outputs", files={"in/note.txt": b"from the python sdk"}
    )
    ended = client.runs.wait(run.id)
    assert ended.status == "succeeded", ended
    arts = {a.path: a for a in client.runs.artifacts(run.id)}
    assert sorted(arts) == ["leak", "note.txt"], arts
    assert str(arts["leak"].refused) == "symlink" and arts["leak"].download_url is None
    assert client.runs.download(run.id, "note.txt") == b"FROM THE PYTHON SDK"
    with pytest.raises(AirlockError) as e:
        client.runs.download(run.id, "leak")
    assert e.value.status == 404
    # A path that leaves the workspace is refused before anything is queued.
    with pytest.raises(AirlockError) as e:
        client.runs.create("sdk-outputs", files={"../escape.txt": "x"})
    assert (e.value.status, e.value.code) == (422, "invalid")


def test_an_error_inside_a_stream_carries_its_own_status(client, server):
    from airlock_client.generated.api.api_keys import create_api_key, revoke_api_key
    from airlock_client.generated.models import NewApiKey

    client.agents.register(AGENTS / "sdk-sleeper")
    run = client.runs.create("sdk-sleeper")
    made = create_api_key.sync(client=client.api, body=NewApiKey(name="sdk-stream"))
    with Client(server[0], made.key, reconnects=0) as other:
        events = other.runs.stream(run.id)
        for ev in events:
            if ev.event == "log":
                break
        revoke_api_key.sync_detailed(made.id, client=client.api)
        with pytest.raises(AirlockError) as e:
            for _ in events:
                pass
    assert (e.value.status, e.value.code) == (401, "unauthorized")
    client.runs.cancel(run.id)
