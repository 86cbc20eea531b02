"""The operator's console in a real browser: Playwright for Python driving
Debian's chromium (executable_path, never Playwright's own download).

Run by the suite's serve_console::console_in_a_browser against an
`airlock serve` it started: CONSOLE_URL (the console's origin),
PREVIEW_ORIGIN (USERCONTENT_URL), API_KEY, CANARY (a secret of the runs'
that no page may show), CHROMIUM, SCREENSHOTS (a directory), HELD_AGENT and
HELD_PROMPT (an agent whose one request an `ask` rule holds, and its
prompt), HELD_CANARY (in that request's query, header and body).

Checks: sign in; a run, created while its page is open, goes to succeeded
live (its log streamed); its egress audit shows the refusal with its code;
its preview renders in the sandboxed frame and every attack it tries on the
console fails (cookies, DOM, storage, fetch with the session, top-frame
navigation, a form to the console); a top-level visit to the preview shows
its source as text; the usage chart is drawn; a request an `ask` rule
holds is allowed from its run's page by a click, and the run then
succeeds; no page holds the canary;
nothing is requested outside the server (every other request is aborted
and counted: none may be).
"""

import json
import os
import sys
import urllib.request

from playwright.sync_api import expect, sync_playwright

CONSOLE = os.environ["CONSOLE_URL"]
PREVIEW = os.environ["PREVIEW_ORIGIN"]
KEY = os.environ["API_KEY"]
CANARY = os.environ["CANARY"]
SHOTS = os.environ["SCREENSHOTS"]

aborted = []
requests = []


def api(method, path, body=None):
    req = urllib.request.Request(
        CONSOLE + path,
        data=None if body is None else json.dumps(body).encode(),
        method=method,
        headers={"authorization": "Bearer " + KEY, "content-type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read() or b"null")


def only_the_server(route):
    url = route.request.url
    requests.append((route.request.method, url, route.request.frame.url if route.request.frame else ""))
    if url.startswith(CONSOLE + "/") or url.startswith(PREVIEW + "/"):
        route.continue_()
    else:
        aborted.append(url)
        route.abort()


def no_secret(page, what):
    html = page.content()
    assert CANARY not in html, f"{what}: the canary is in the page"
    assert KEY not in html, f"{what}: the API key is in the page"


def shot(page, name):
    page.screenshot(path=os.path.join(SHOTS, name + ".png"), full_page=True)


def main():
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=os.environ["CHROMIUM"],
            headless=True,
            args=["--no-sandbox"],
        )
        ctx = browser.new_context(viewport={"width": 1280, "height": 900})
        ctx.route("**/*", only_the_server)
        page = ctx.new_page()
        errors = []
        navigations = []
        page.on("framenavigated", lambda f: navigations.append(f.url[:80]) if f == page.main_frame else None)
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)

        # Sign in.
        page.goto(CONSOLE + "/console/runs")
        assert page.url == CONSOLE + "/console/sign-in", page.url
        shot(page, "sign-in")
        no_secret(page, "sign-in")
        page.fill("#key", KEY)
        page.click("#sign-in")
        page.wait_for_url(CONSOLE + "/console/runs")
        cookies = {c["name"]: c for c in ctx.cookies()}
        session = cookies["airlock_console"]
        assert session["httpOnly"] and session["sameSite"] == "Strict", session
        assert page.evaluate("document.cookie") == "", "the session cookie is HttpOnly"

        # A run, queued now: its page follows it live to succeeded (its
        # model call answers slowly, so the page opens on it live).
        run = api("POST", "/v1/runs", {"agent": "console", "prompt": f"refuse model slow html {CONSOLE}"})
        rid = run["id"]
        # The open list shows it without a reload.
        page.wait_for_selector(f'tr[data-run="{rid}"]', timeout=30_000)
        assert len(navigations) == 2, navigations
        page.click(f'tr[data-run="{rid}"] a')
        page.wait_for_url(CONSOLE + "/console/runs/" + rid)
        first = page.text_content("#run-status")
        assert first in ("queued", "running"), f"the page opened on a live run, not {first}"
        # (Waits are Playwright's own assertions: the console's CSP forbids
        # the eval that wait_for_function needs.)
        expect(page.locator("#log")).to_contain_text("agent: starting", timeout=60_000)
        expect(page.locator("#run-status")).to_have_text("succeeded", timeout=90_000)
        # The end re-renders the page with the egress, the cost, the result.
        page.wait_for_selector('body[data-terminal="true"] #preview', timeout=30_000)
        print("navigations so far:", navigations)
        assert page.text_content("#run-status") == "succeeded"

        # The egress audit: the refusal, highlighted, with its code.
        refused = page.locator("#egress tr.refused")
        if refused.count() < 1:
            shot(page, "run-failed")
        assert refused.count() >= 1, "a refused row: " + page.text_content("#egress") + page.text_content("#log")
        row = refused.first.text_content()
        assert "not_authorized" in row and "elsewhere.example" in row, row
        assert "gpt-fake" in page.text_content("#cost")
        no_secret(page, "run")

        # The preview: rendered in the sandboxed frame, on its own origin.
        frame_el = page.locator("#preview")
        assert frame_el.get_attribute("sandbox") == "allow-scripts"
        src = frame_el.get_attribute("src")
        assert src.startswith(PREVIEW + "/usercontent/runs/" + rid + "/preview?"), src
        frame = page.frame_locator("#preview")
        frame.locator("h1").wait_for(timeout=30_000)
        out = frame.locator("#out")
        out.wait_for(timeout=30_000)
        expect(out).not_to_have_text("running", timeout=30_000)
        results = json.loads(out.text_content())
        print("preview attacks:", json.dumps(results, indent=1))
        assert results["origin"] == "null", results
        for attack in ["cookie", "storage", "parent_dom", "parent_cookie", "fetch_console", "fetch_api"]:
            assert results[attack].startswith("blocked"), (attack, results[attack])
        shot(page, "run")

        # The top frame was not navigated, no form reached the console, the
        # session still works, and nothing of the preview's reached it.
        assert page.url == CONSOLE + "/console/runs/" + rid, page.url
        posts = [r for r in requests if r[0] == "POST"]
        assert all(r[1] == CONSOLE + "/console/sign-in" for r in posts), posts
        from_preview = [r for r in requests if r[2].startswith(PREVIEW) and not r[1].startswith(PREVIEW)]
        assert from_preview == [], from_preview
        status = page.evaluate("fetch('/console/data/runs').then(r => r.status)")
        assert status == 200, f"still signed in: {status}"

        # A top-level visit to the preview: its source, as text.
        top = ctx.new_page()
        top.goto(src)
        assert top.evaluate("document.contentType") == "text/plain", top.evaluate("document.contentType")
        assert top.evaluate("document.getElementById('out')") is None, "not rendered"
        assert "<script>" in top.text_content("body")
        shot(top, "preview-top-level")
        top.close()

        # Connections: named, never their secret.
        page.goto(CONSOLE + "/console/connections")
        assert "llm" in page.text_content("#connections")
        no_secret(page, "connections")
        shot(page, "connections")

        # Usage: the chart, drawn by the page from the runs API.
        page.goto(CONSOLE + "/console/usage")
        page.wait_for_selector("#usage-chart rect.bar", timeout=30_000)
        assert page.locator("#usage tbody tr").count() >= 1
        no_secret(page, "usage")
        shot(page, "usage")

        # The runs list, with the run.
        page.goto(CONSOLE + "/console/runs")
        assert page.locator(f'tr[data-run="{rid}"] .status').text_content() == "succeeded"
        no_secret(page, "runs")
        shot(page, "runs")

        # A request held by an `ask` rule: its run's page renders itself
        # again once it is held, with its answers; "allow once" lets it go on.
        held = api("POST", "/v1/runs", {"agent": os.environ["HELD_AGENT"], "prompt": os.environ["HELD_PROMPT"]})
        hid = held["id"]
        # The runs list (refreshing itself) says a request waits, and on
        # which run; its count leads to the run's page.
        page.goto(CONSOLE + "/console/runs")
        waiting = page.locator(f'tr[data-run="{hid}"] td.waiting a')
        expect(waiting).to_have_text("1", timeout=60_000)
        expect(page.locator("#waiting")).to_be_visible()
        assert "1 held request waits" in page.text_content("#waiting"), page.text_content("#waiting")
        shot(page, "runs-waiting")
        waiting.click()
        page.wait_for_url(CONSOLE + "/console/runs/" + hid + "#approvals")
        allow = page.locator('#approvals tr.pending button[value="allow_once"]')
        allow.wait_for(timeout=60_000)
        row = page.locator("#approvals tr.pending").text_content()
        assert "POST" in row and "/items/7" in row and "write" in row, row
        assert os.environ["HELD_CANARY"] not in page.content(), "the held request's secret is in the page"
        no_secret(page, "approval")
        shot(page, "approval")
        allow.click()
        expect(page.locator("#run-status")).to_have_text("succeeded", timeout=90_000)
        page.wait_for_selector('body[data-terminal="true"] #approvals tr.allowed_once', timeout=30_000)
        assert page.locator("#approvals tr.pending").count() == 0
        # Answered and ended: nothing waits any more.
        page.goto(CONSOLE + "/console/runs")
        assert page.locator(f'tr[data-run="{hid}"] td.waiting a').count() == 0
        assert page.locator("#waiting").is_hidden()

        # The console's own pages broke no rule of their policy (the
        # preview's refused attacks are reported in the same console: they
        # name the console's URLs the preview tried).
        csp_errors = [e for e in errors if "Content Security Policy" in e and "/console/data/" not in e and "/v1/" not in e]
        assert csp_errors == [], csp_errors[:5]
        assert aborted == [], f"requests outside the server: {aborted}"
        browser.close()
    counts = {}
    for _, url, _ in requests:
        path = url.split("?")[0]
        counts[path] = counts.get(path, 0) + 1
    print(json.dumps(counts, indent=1))
    print(f"ok: {len(requests)} requests, all to the server")


if __name__ == "__main__":
    try:
        main()
    except AssertionError as e:
        print("FAILED:", e, file=sys.stderr)
        raise
