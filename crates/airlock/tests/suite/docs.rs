//! The documentation in `docs/` agrees with the code: the manifest keys
//! the parser accepts, the environment variables the code reads, and the
//! egress guard's own tables (blocked names, address ranges, codes), which
//! are generated into `docs/egress.md` from the code
//! (`AIRLOCK_BLESS_DOCS=1 cargo test -p airlock --test suite -- docs::` rewrites them).
#![allow(clippy::unwrap_used)] // a test may unwrap: a panic is its failure

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use airlock_platform::manifest::{
    Agent, BudgetSection, Delivery, IntegrationSection, Manifest, ModelSection, NetworkSection,
};
use serde::de::{self, Deserialize, Deserializer, Visitor};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn doc(name: &str) -> String {
    std::fs::read_to_string(root().join("docs").join(name))
        .unwrap_or_else(|e| panic!("docs/{name}: {e}"))
}

/// The field names serde's derive gives `T` (what the parser accepts).
fn fields<'de, T: Deserialize<'de>>() -> Vec<&'static str> {
    struct Recorder<'a>(&'a mut Vec<&'static str>);
    impl<'de> Deserializer<'de> for Recorder<'_> {
        type Error = de::value::Error;
        fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
            Err(de::Error::custom("not a struct"))
        }
        fn deserialize_struct<V: Visitor<'de>>(
            self,
            _: &'static str,
            fields: &'static [&'static str],
            _: V,
        ) -> Result<V::Value, Self::Error> {
            self.0.extend_from_slice(fields);
            Err(de::Error::custom("recorded"))
        }
        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
            bytes byte_buf option unit unit_struct newtype_struct seq tuple
            tuple_struct map enum identifier ignored_any
        }
    }
    let mut out = Vec::new();
    let _ = T::deserialize(Recorder(&mut out));
    assert!(
        !out.is_empty(),
        "{} has no fields",
        std::any::type_name::<T>()
    );
    out
}

#[test]
fn every_manifest_key_the_parser_accepts_is_documented() {
    let text = doc("manifest.md");
    let mut keys = vec![];
    for f in fields::<Manifest>() {
        keys.push(f.to_string());
    }
    for (prefix, fs) in [
        ("agent", fields::<Agent>()),
        ("model", fields::<ModelSection>()),
        ("network", fields::<NetworkSection>()),
        ("budget", fields::<BudgetSection>()),
        ("integrations[]", fields::<IntegrationSection>()),
        ("integrations[].delivery", fields::<Delivery>()),
    ] {
        for f in fs {
            keys.push(format!("{prefix}.{f}"));
        }
    }
    let missing: Vec<_> = keys
        .iter()
        .filter(|k| {
            let sections = ["agent", "model", "network", "budget", "integrations"];
            if sections.contains(&k.as_str()) {
                return !text.contains(&format!("[{k}]")) && !text.contains(&format!("[[{k}]]"));
            }
            !text.contains(&format!("| `{k}` |"))
        })
        .collect();
    assert!(
        missing.is_empty(),
        "docs/manifest.md does not document {missing:?}"
    );
}

#[test]
fn the_documented_example_manifest_is_valid() {
    let text = doc("manifest.md");
    let start = text.find("```toml\n").unwrap() + "```toml\n".len();
    let end = start + text[start..].find("```").unwrap();
    let m = Manifest::parse(&text[start..end]).unwrap();
    assert_eq!(m.integrations.len(), 1);
    assert!(m.model.is_some() && m.network.is_some());
}

/// Every `.rs` file under `dir`.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The string literal that starts right after `at` in `line`.
fn literal_after(line: &str, at: usize) -> Option<&str> {
    let rest = &line[at..];
    let end = rest.find('"')?;
    Some(&rest[..end])
}

fn is_env_name(s: &str) -> bool {
    s.len() >= 3
        && s.contains('_') | (s == "HOME")
        && s.bytes()
            .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
}

/// The environment variables the code reads: literals passed to the
/// functions that read the environment, and the `ENV_*` name constants.
fn variables_read() -> BTreeSet<String> {
    let readers = [
        "env::var(\"",
        "env::var_os(\"",
        "try_from_env(\"",
        "from_env(\"",
        " num(\"",
        " get(\"",
    ];
    let mut files = vec![];
    for c in std::fs::read_dir(root().join("crates")).unwrap().flatten() {
        // The probe is an agent (test-only): what it reads is what the
        // agent sees ("What the agent sees"), not a setting of Airlock's.
        if c.file_name() == "airlock-probe" {
            continue;
        }
        let src = c.path().join("src");
        if src.is_dir() {
            sources(&src, &mut files);
        }
    }
    let mut found = BTreeSet::new();
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        // Test modules read whatever they like (the CI variables, …).
        let text = text.split("#[cfg(test)]").next().unwrap_or_default();
        for line in text.lines() {
            let t = line.trim_start();
            if t.starts_with("//") {
                continue;
            }
            for r in readers {
                let mut from = 0;
                while let Some(i) = line[from..].find(r) {
                    let at = from + i + r.len();
                    if let Some(name) = literal_after(line, at)
                        && is_env_name(name)
                    {
                        found.insert(name.to_owned());
                    }
                    from = at;
                }
            }
            if (t.starts_with("pub const ENV_") || t.starts_with("const ENV_"))
                && let Some(i) = line.find("= \"")
                && let Some(name) = literal_after(line, i + 3)
            {
                found.insert(name.to_owned());
            }
        }
    }
    found
}

#[test]
fn every_environment_variable_the_code_reads_is_documented_and_no_other() {
    let text = doc("configuration.md");
    let documented: BTreeSet<String> = text
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split('`').next())
        .filter(|n| is_env_name(n))
        .map(str::to_owned)
        .collect();
    let read = variables_read();
    assert!(
        read.len() >= 15,
        "the scan finds the variables it should: {read:?}"
    );
    let undocumented: Vec<_> = read.difference(&documented).collect();
    assert!(
        undocumented.is_empty(),
        "read by the code, missing from docs/configuration.md: {undocumented:?}"
    );
    let stale: Vec<_> = documented.difference(&read).collect();
    assert!(
        stale.is_empty(),
        "in docs/configuration.md, read by no code: {stale:?}"
    );
}

/// Replaces the text between `<!-- NAME:start … -->` and `<!-- NAME:end -->`.
fn section(text: &str, name: &str) -> (usize, usize) {
    let open = format!("<!-- {name}:start");
    let s = text.find(&open).unwrap_or_else(|| panic!("no {open}"));
    let s = s + text[s..].find("-->\n").unwrap() + 4;
    let e = text.find(&format!("<!-- {name}:end -->")).unwrap();
    (s, e)
}

fn generated_egress_sections() -> Vec<(&'static str, String)> {
    use airlock_egress::{EgressCode, Treatment};
    let names: String = airlock_egress::BLOCKED_NAMES
        .iter()
        .map(|n| format!("- `{n}`\n"))
        .collect();
    let mut ranges =
        String::from("| range | what it is | source | treatment |\n|---|---|---|---|\n");
    for r in airlock_egress::blocked_ranges() {
        ranges.push_str(&format!(
            "| `{}` | {} | {} | {} |\n",
            r.net,
            r.why,
            r.source,
            match r.treatment {
                Treatment::Block => "refused",
                Treatment::JudgeEmbeddedIpv4 => "the embedded IPv4 address is judged",
            }
        ));
    }
    let mut codes = String::from("| code | HTTP status | kind |\n|---|---|---|\n");
    for c in EgressCode::ALL {
        codes.push_str(&format!(
            "| `{}` | {} | {} |\n",
            c.as_str(),
            c.http_status(),
            if c.is_ssrf() {
                "SSRF (where it would have gone)"
            } else {
                "policy (what the call may do)"
            }
        ));
    }
    let mut presets = String::from("| preset | methods |\n|---|---|\n");
    for p in airlock_egress::Preset::ALL {
        let methods = match p.methods() {
            Some(ms) => ms
                .iter()
                .map(|m| format!("`{m}`"))
                .collect::<Vec<_>>()
                .join(", "),
            None => "every method".to_owned(),
        };
        presets.push_str(&format!("| `{}` | {methods} |\n", p.as_str()));
    }
    vec![
        ("blocked-names", names),
        ("blocked-ranges", ranges),
        ("codes", codes),
        ("presets", presets),
    ]
}

/// The manifest of docs/egress.md's L7 rules example.
fn l7_example_manifest(text: &str) -> Manifest {
    let at = text.find("## L7 rules").unwrap();
    let start = at + text[at..].find("```toml\n").unwrap() + "```toml\n".len();
    let end = start + text[start..].find("```").unwrap();
    Manifest::parse(&text[start..end]).unwrap()
}

/// The L7 rules' example in docs/egress.md: its manifest loads, and each
/// request of its table gets the documented decision from the guard.
#[test]
fn the_l7_rule_examples_are_what_the_guard_decides() {
    use airlock_egress::{AuthorizedUris, CallRules, EgressPolicy, Intent, Missing, Target};
    let text = doc("egress.md");
    let m = l7_example_manifest(&text);
    let integ = &m.integrations[0];
    let list = AuthorizedUris::parse(&integ.authorized_uris).with_rules(integ.rules.compiled());
    let rules = CallRules {
        authorized: &list,
        allow_all_uris: false,
        credentialed: true,
    };
    let (s, e) = section(&text, "l7-examples");
    let rows: Vec<&str> = text[s..e].lines().skip(2).collect();
    assert!(rows.len() >= 6, "{rows:?}");
    for row in rows {
        let cells: Vec<&str> = row.split(" | ").collect();
        let request = cells[0].trim_start_matches("| `").trim_end_matches('`');
        let want = cells[1].trim_end_matches(" |");
        let (method, url) = request.split_once(' ').unwrap();
        let method = http::Method::from_bytes(method.as_bytes()).unwrap();
        let got = EgressPolicy::new().check(
            &Target::parse(url).unwrap(),
            Intent::Request(&method),
            &rules,
        );
        let got = match got {
            Ok(c) => match c.hold {
                None => "allowed".to_owned(),
                Some(h) => format!("held: `{}`, {} s", h.rule, h.timeout.as_secs()),
            },
            Err(e) => {
                let r = e.rule.clone().unwrap_or_else(|| panic!("{request}: {e}"));
                let what = match &r.missing {
                    Missing::Method { method } => format!("method `{method}`"),
                    Missing::Path { path } => format!("path `{path}`"),
                    Missing::Query { parameter } => format!("query `{parameter}`"),
                    Missing::Tunnel => "tunnel".to_owned(),
                    Missing::Withdrawn => "withdrawn".to_owned(),
                };
                format!("refused: `{}`, {what}", r.rule)
            }
        };
        assert_eq!(got, want, "{request}");
    }
}

/// The live policy's examples in docs/egress.md: the narrowing loads
/// within the L7 example's manifest, the widening is refused naming its
/// rule.
#[test]
fn the_live_policy_examples_are_what_the_platform_decides() {
    use airlock_platform_api::policy::PolicyRules;
    let text = doc("egress.md");
    let m = l7_example_manifest(&text);
    let ceiling = PolicyRules {
        network: Vec::new(),
        integrations: m
            .integrations
            .iter()
            .map(|i| (i.namespace.to_string(), i.rules.specs().to_vec()))
            .collect(),
    };
    let at = text.find("## Live policy").unwrap();
    let json_block = |from: usize| {
        let start = from + text[from..].find("```json\n").unwrap() + "```json\n".len();
        let end = start + text[start..].find("```").unwrap();
        (end, text[start..end].to_owned())
    };
    let (next, narrowing) = json_block(at);
    let (_, widening) = json_block(next);
    let body = |s: &str| -> PolicyRules {
        let v: serde_json::Value = serde_json::from_str(s).unwrap();
        serde_json::from_value(v["rules"].clone()).unwrap()
    };
    body(&narrowing).compile(&ceiling).unwrap();
    let refused = body(&widening).compile(&ceiling).unwrap_err();
    assert_eq!(refused.rule(), Some("issues-all"), "{refused}");
    assert!(text[at..].contains("issues-all"));
}

#[test]
fn the_egress_doc_is_generated_from_the_guards_own_tables() {
    let path = root().join("docs/egress.md");
    let mut text = std::fs::read_to_string(&path).unwrap();
    let mut stale = vec![];
    for (name, want) in generated_egress_sections() {
        let (s, e) = section(&text, name);
        if text[s..e] != want {
            stale.push(name);
            text.replace_range(s..e, &want);
        }
    }
    if std::env::var_os("AIRLOCK_BLESS_DOCS").is_some() {
        std::fs::write(&path, &text).unwrap();
        return;
    }
    assert!(
        stale.is_empty(),
        "docs/egress.md is out of date in {stale:?}: run `AIRLOCK_BLESS_DOCS=1 cargo test -p airlock --test suite -- docs::`"
    );
}

#[test]
fn code_comments_cite_the_docs_not_a_file_outside_the_repository() {
    let mut files = vec![];
    for c in std::fs::read_dir(root().join("crates")).unwrap().flatten() {
        sources(&c.path(), &mut files);
    }
    let citing: Vec<String> = files
        .iter()
        .filter(|f| {
            std::fs::read_to_string(f)
                .unwrap()
                .contains(concat!("DESIGN", ".md"))
        })
        .map(|f| f.display().to_string())
        .collect();
    assert!(citing.is_empty(), "cite docs/ instead: {citing:?}");
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    for d in [
        "manifest",
        "configuration",
        "egress",
        "security",
        "architecture",
        "serve",
    ] {
        assert!(
            readme.contains(&format!("docs/{d}.md")),
            "the README links docs/{d}.md"
        );
        assert!(root().join(format!("docs/{d}.md")).exists());
    }
}

/// docs/egress.md's `approval.pending` webhook body: its `data.approval`
/// is an approval as the API answers it, every field and no other.
#[test]
fn the_approval_webhook_example_is_an_approval() {
    let text = doc("egress.md");
    let at = text.find("### Human approval").unwrap();
    let start = at + text[at..].find("```json\n").unwrap() + "```json\n".len();
    let end = start + text[start..].find("```").unwrap();
    let v: serde_json::Value = serde_json::from_str(&text[start..end]).unwrap();
    assert_eq!(v["type"], airlock_store::APPROVAL_PENDING_EVENT);
    let shown = &v["data"]["approval"];
    let a: airlock_api::v1::Approval = serde_json::from_value(shown.clone()).unwrap();
    assert_eq!(a.state, airlock_api::v1::ApprovalState::Pending);
    let keys = |v: &serde_json::Value| -> BTreeSet<String> {
        v.as_object().unwrap().keys().cloned().collect()
    };
    assert_eq!(keys(shown), keys(&serde_json::to_value(&a).unwrap()));
}
