//! The house's rules (issue 35), checked over every crate's `services/*/src`: no circle of imports between the
//! files of a crate, and no file longer than [`MAX_LINES`] lines outside its tests.
//!
//! A file's imports are the module paths it names: `use` trees (braces expanded), and `crate::…`, `super::…`,
//! `self::…` paths anywhere in its code, plus paths that start with one of its own child modules; each names
//! the file of the longest module prefix that exists. Comments, string literals and `#[cfg(test)]` modules are
//! left out, and so is the crate's root (`lib.rs`, `main.rs`: its facade of re-exports).
//!
//! A binary in a folder of its own (`src/bin/<name>/main.rs`) is checked as a crate of its own; a one-file binary
//! only for its length. `AHP_STRUCTURE_EDGES=<crate folder>` prints a crate's imports between files.
//!
//! Every file keeps both rules (issue 35 mended the last exceptions; there is no list of allowed ones). Known
//! blind spots: a path through a name the crate's root re-exports (`crate::Name`) counts as naming the root,
//! which is left out; and a path through a name brought in by `use` (`alias::item`) names only the alias's module.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Most lines a file may have outside its tests.
const MAX_LINES: usize = 600;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// One crate's source files, by module path (`["host"]`, `["acp", "session"]`; the root is `[]`).
fn modules_of(src: &Path) -> BTreeMap<Vec<String>, PathBuf> {
    let mut found = BTreeMap::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("read_dir").flatten() {
            let path = entry.path();
            if path.is_dir() {
                if path != src.join("bin") {
                    stack.push(path);
                }
                continue;
            }
            if path.extension().and_then(|e| e.to_str()) != Some("rs") {
                continue;
            }
            let relative = path.strip_prefix(src).expect("under src");
            let mut segments: Vec<String> = relative
                .iter()
                .map(|part| part.to_string_lossy().trim_end_matches(".rs").to_string())
                .collect();
            if matches!(segments.last().map(String::as_str), Some("mod")) {
                segments.pop();
            }
            if segments.len() == 1 && matches!(segments[0].as_str(), "lib" | "main") {
                segments.clear();
            }
            found.insert(segments, path);
        }
    }
    found
}

/// `text` without comments, string and char literals (each replaced by a space), keeping line breaks.
fn code_only(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    if chars[i] == '\n' {
                        out.push('\n');
                    }
                    i += 1;
                }
            }
            out.push(' ');
        } else if c == 'r'
            && (next == Some('#') || next == Some('"'))
            && (!is_ident(chars.get(i.wrapping_sub(1)))
                || (matches!(chars.get(i.wrapping_sub(1)), Some('b' | 'c'))
                    && !is_ident(chars.get(i.wrapping_sub(2)))))
        {
            // A raw string: r"…", r#"…"#, br"…", cr#"…"#.
            let mut j = i + 1;
            let mut hashes = 0;
            while chars.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if chars.get(j) != Some(&'"') {
                out.push(c);
                i += 1;
                continue;
            }
            j += 1;
            loop {
                match chars.get(j) {
                    None => break,
                    Some('"') if (1..=hashes).all(|k| chars.get(j + k) == Some(&'#')) => {
                        j += 1 + hashes;
                        break;
                    }
                    Some('\n') => {
                        out.push('\n');
                        j += 1;
                    }
                    Some(_) => j += 1,
                }
            }
            out.push(' ');
            i = j;
        } else if c == '"' {
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                if chars[i] == '\\' {
                    i += 1;
                } else if chars[i] == '\n' {
                    out.push('\n');
                }
                i += 1;
            }
            i += 1;
            out.push(' ');
        } else if c == '\'' {
            // A char literal ('x', '\n', '\u{…}'), or a lifetime (left as it is).
            let close = if next == Some('\\') {
                (i + 3..chars.len().min(i + 12)).find(|&k| chars[k] == '\'')
            } else if chars.get(i + 2) == Some(&'\'') {
                Some(i + 2)
            } else {
                None
            };
            match close {
                Some(end) => {
                    out.push(' ');
                    i = end + 1;
                }
                None => {
                    out.push(c);
                    i += 1;
                }
            }
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

fn is_ident(c: Option<&char>) -> bool {
    c.is_some_and(|c| c.is_alphanumeric() || *c == '_')
}

/// `code` without its `#[cfg(test)]` items (a `mod … { … }` or the item after the attribute, to its end).
fn without_tests(code: &str) -> String {
    let mut out = code.to_string();
    while let Some(at) = out.find("#[cfg(test)]") {
        let rest = &out[at..];
        let end = match (rest.find('{'), rest.find(';')) {
            (Some(open), semi) if semi.is_none_or(|semi| open < semi) => {
                let mut depth = 0;
                let mut end = rest.len();
                for (k, c) in rest[open..].char_indices() {
                    match c {
                        '{' => depth += 1,
                        '}' => {
                            depth -= 1;
                            if depth == 0 {
                                end = open + k + 1;
                                break;
                            }
                        }
                        _ => {}
                    }
                }
                end
            }
            (_, Some(semi)) => semi + 1,
            _ => rest.len(),
        };
        out.replace_range(at..at + end, "\n");
    }
    out
}

/// The tokens of `code` that paths are made of: identifiers, `::`, `{`, `}`, `,`, `;`, `*`, and `#` for the rest.
fn tokens(code: &str) -> Vec<String> {
    let chars: Vec<char> = code.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_alphabetic() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            out.push(chars[start..i].iter().collect());
            continue;
        }
        if c == ':' && chars.get(i + 1) == Some(&':') {
            out.push("::".into());
            i += 2;
            continue;
        }
        if matches!(c, '{' | '}' | ',' | ';' | '*') {
            out.push(c.to_string());
        } else if !c.is_whitespace() {
            out.push("#".into());
        }
        i += 1;
    }
    out
}

/// Every path a `use` tree starting at `tokens[at]` names, braces expanded; and where the tree ends.
fn use_paths(tokens: &[String], mut at: usize, prefix: Vec<String>, out: &mut Vec<Vec<String>>) -> usize {
    let mut path = prefix;
    loop {
        match tokens.get(at).map(String::as_str) {
            Some("{") => {
                at += 1;
                loop {
                    at = use_paths(tokens, at, path.clone(), out);
                    match tokens.get(at).map(String::as_str) {
                        Some(",") => at += 1,
                        Some("}") => return at + 1,
                        _ => return at,
                    }
                    if tokens.get(at).map(String::as_str) == Some("}") {
                        return at + 1;
                    }
                }
            }
            Some("::") => at += 1,
            Some("as") => {
                at += 2;
                out.push(path);
                return at;
            }
            Some(word) if word != "," && word != "}" && word != ";" && word != "*" && word != "#" => {
                path.push(word.to_string());
                at += 1;
            }
            Some("*") => {
                out.push(path);
                return at + 1;
            }
            _ => {
                out.push(path);
                return at;
            }
        }
    }
}

/// The module paths `code` (of the module at `me`) names, as written.
fn named_paths(code: &str) -> Vec<Vec<String>> {
    let tokens = tokens(code);
    let mut out = Vec::new();
    let mut i = 0;
    while i < tokens.len() {
        if tokens[i] == "use" {
            i = use_paths(&tokens, i + 1, Vec::new(), &mut out);
            continue;
        }
        // `pub(crate)`, `pub(super)`, `pub(in …)` name who may see an item, not a module it uses.
        if tokens[i] == "pub" && tokens.get(i + 1).map(String::as_str) == Some("#") {
            i += 2;
            while tokens.get(i).is_some_and(|t| t != "#") {
                i += 1;
            }
            continue;
        }
        let starts_path = matches!(tokens[i].as_str(), "crate" | "super" | "self")
            || (tokens.get(i + 1).map(String::as_str) == Some("::")
                && i.checked_sub(1).is_none_or(|before| tokens[before] != "::"));
        if starts_path {
            let mut path = vec![tokens[i].clone()];
            let mut j = i + 1;
            while tokens.get(j).map(String::as_str) == Some("::")
                && tokens
                    .get(j + 1)
                    .is_some_and(|t| t.chars().all(|c| c.is_alphanumeric() || c == '_'))
            {
                path.push(tokens[j + 1].clone());
                j += 2;
            }
            out.push(path);
            i = j;
            continue;
        }
        i += 1;
    }
    out
}

/// The module a path written in module `me` leads to: the longest prefix that is a module of the crate.
fn resolve(me: &[String], path: &[String], modules: &BTreeMap<Vec<String>, PathBuf>) -> Option<Vec<String>> {
    let mut absolute: Vec<String> = Vec::new();
    let mut rest = path;
    match path.first().map(String::as_str) {
        Some("crate") => rest = &path[1..],
        Some("self") => {
            absolute = me.to_vec();
            rest = &path[1..];
        }
        Some("super") => {
            absolute = me.to_vec();
            while rest.first().map(String::as_str) == Some("super") {
                absolute.pop()?;
                rest = &rest[1..];
            }
        }
        Some(first) => {
            // A child module of this one (uniform paths), else another crate.
            let mut child = me.to_vec();
            child.push(first.to_string());
            if !modules.contains_key(&child) {
                return None;
            }
            absolute = me.to_vec();
        }
        None => return None,
    }
    absolute.extend(rest.iter().cloned());
    (0..=absolute.len())
        .rev()
        .map(|n| absolute[..n].to_vec())
        .find(|prefix| modules.contains_key(prefix))
}

/// What the check finds: the files in a circle, and the files over the limit (with their lengths).
fn violations() -> (BTreeSet<String>, BTreeMap<String, usize>) {
    let root = root();
    let mut in_circles = BTreeSet::new();
    let mut too_long = BTreeMap::new();
    let mut crates: Vec<PathBuf> = std::fs::read_dir(root.join("services"))
        .expect("services")
        .flatten()
        .map(|entry| entry.path().join("src"))
        .filter(|src| src.is_dir())
        .collect();
    // A binary in a folder of its own (`src/bin/<name>/main.rs`) is a crate of its own: its files are checked
    // like a library's.
    let bin_folders: Vec<PathBuf> = crates
        .iter()
        .filter_map(|src| std::fs::read_dir(src.join("bin")).ok())
        .flat_map(|entries| entries.flatten().map(|entry| entry.path()))
        .filter(|path| path.join("main.rs").is_file())
        .collect();
    crates.extend(bin_folders);
    crates.sort();
    for src in crates {
        let modules = modules_of(&src);
        let mut edges: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
        for (me, file) in &modules {
            let text = std::fs::read_to_string(file).expect("read");
            let code = without_tests(&code_only(&text));
            let name = file
                .strip_prefix(&root)
                .expect("in the repository")
                .display()
                .to_string();
            let lines = code.trim_end().lines().count();
            if lines > MAX_LINES {
                too_long.insert(name, lines);
            }
            for path in named_paths(&code) {
                if let Some(target) = resolve(me, &path, &modules) {
                    if &target != me && !target.is_empty() && !me.is_empty() {
                        edges.entry(me.clone()).or_default().insert(target);
                    }
                }
            }
        }
        // `AHP_STRUCTURE_EDGES=<crate folder>` prints that crate's imports between files, for planning a move.
        if std::env::var("AHP_STRUCTURE_EDGES").ok().as_deref()
            == src.parent().and_then(|p| p.file_name()).and_then(|n| n.to_str())
        {
            for (from, tos) in &edges {
                for to in tos {
                    eprintln!("edge {} -> {}", from.join("::"), to.join("::"));
                }
            }
        }
        for circle in strongly_connected(&modules, &edges) {
            for module in circle {
                in_circles.insert(
                    modules[&module]
                        .strip_prefix(&root)
                        .expect("in")
                        .display()
                        .to_string(),
                );
            }
        }
    }
    let mut more_long = BTreeMap::new();
    // src/bin files are crates of their own: only their length is checked.
    for bin in glob_bins(&root) {
        let text = std::fs::read_to_string(&bin).expect("read");
        let lines = without_tests(&code_only(&text)).trim_end().lines().count();
        if lines > MAX_LINES {
            more_long.insert(bin.strip_prefix(&root).expect("in").display().to_string(), lines);
        }
    }
    too_long.extend(more_long);
    (in_circles, too_long)
}

fn glob_bins(root: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(root.join("services"))
        .expect("services")
        .flatten()
    {
        let bin = entry.path().join("src/bin");
        if let Ok(files) = std::fs::read_dir(bin) {
            found.extend(
                files
                    .flatten()
                    .map(|f| f.path())
                    .filter(|p| p.extension().is_some_and(|e| e == "rs")),
            );
        }
    }
    found
}

/// The circles (strongly connected sets of more than one module) of the graph (Tarjan's algorithm).
fn strongly_connected(
    modules: &BTreeMap<Vec<String>, PathBuf>,
    edges: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
) -> Vec<Vec<Vec<String>>> {
    struct State<'a> {
        edges: &'a BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
        index: BTreeMap<Vec<String>, usize>,
        low: BTreeMap<Vec<String>, usize>,
        stack: Vec<Vec<String>>,
        on_stack: BTreeSet<Vec<String>>,
        next: usize,
        found: Vec<Vec<Vec<String>>>,
    }
    fn visit(state: &mut State, node: &[String]) {
        state.index.insert(node.to_vec(), state.next);
        state.low.insert(node.to_vec(), state.next);
        state.next += 1;
        state.stack.push(node.to_vec());
        state.on_stack.insert(node.to_vec());
        let targets: Vec<Vec<String>> = state.edges.get(node).into_iter().flatten().cloned().collect();
        for target in targets {
            if !state.index.contains_key(&target) {
                visit(state, &target);
                let low = state.low[&target].min(state.low[node]);
                state.low.insert(node.to_vec(), low);
            } else if state.on_stack.contains(&target) {
                let low = state.index[&target].min(state.low[node]);
                state.low.insert(node.to_vec(), low);
            }
        }
        if state.low[node] == state.index[node] {
            let mut circle = Vec::new();
            while let Some(top) = state.stack.pop() {
                state.on_stack.remove(&top);
                let done = top == node;
                circle.push(top);
                if done {
                    break;
                }
            }
            if circle.len() > 1 {
                state.found.push(circle);
            }
        }
    }
    let mut state = State {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        next: 0,
        found: Vec::new(),
    };
    for module in modules.keys() {
        if !state.index.contains_key(module) {
            visit(&mut state, module);
        }
    }
    state.found
}

#[test]
fn no_circle_of_imports_and_no_long_file() {
    let (in_circles, too_long) = violations();
    let mut problems = Vec::new();
    for file in &in_circles {
        problems.push(format!(
            "{file} is in a circle of imports (break it: a type on the floor below, or a trait at the boundary)"
        ));
    }
    for (file, lines) in &too_long {
        problems.push(format!(
            "{file} has {lines} lines outside its tests (at most {MAX_LINES}): split it by concern"
        ));
    }
    assert!(
        problems.is_empty(),
        "the house's rules:\n  {}",
        problems.join("\n  ")
    );
}

/// The check finds what it is for: a planted circle of two files, and a file too long, in a crate of its own.
#[test]
fn the_check_finds_a_planted_circle_and_a_long_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let src = dir.path().join("src");
    std::fs::create_dir_all(src.join("floor")).expect("mkdir");
    std::fs::write(src.join("lib.rs"), "mod a;\nmod b;\nmod floor;\nmod c;\n").expect("write");
    std::fs::write(src.join("a.rs"), "use crate::b::B;\npub struct A;\n").expect("write");
    std::fs::write(
        src.join("b.rs"),
        "use crate::{floor::Base, a::A};\n// crate::c::C in a comment\nconst S: &str = \"crate::c\";\npub struct B;\n",
    )
    .expect("write");
    std::fs::write(src.join("floor/mod.rs"), "pub struct Base;\n").expect("write");
    std::fs::write(
        src.join("c.rs"),
        format!(
            "pub fn f() -> super::floor::Base {{ super::floor::Base }}\n{}#[cfg(test)]\nmod tests {{\n    use crate::a::A;\n}}\n",
            "// a line\n".repeat(10) + &"pub const X: u8 = 1;\n".repeat(MAX_LINES)
        ),
    )
    .expect("write");
    let modules = modules_of(&src);
    let mut edges: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    let mut lengths = BTreeMap::new();
    for (me, file) in &modules {
        let code = without_tests(&code_only(&std::fs::read_to_string(file).expect("read")));
        lengths.insert(me.join("::"), code.trim_end().lines().count());
        for path in named_paths(&code) {
            if let Some(target) = resolve(me, &path, &modules) {
                if &target != me && !target.is_empty() && !me.is_empty() {
                    edges.entry(me.clone()).or_default().insert(target);
                }
            }
        }
    }
    let circles = strongly_connected(&modules, &edges);
    let named: Vec<BTreeSet<String>> = circles
        .iter()
        .map(|circle| circle.iter().map(|m| m.join("::")).collect())
        .collect();
    assert_eq!(
        named,
        vec![BTreeSet::from(["a".to_string(), "b".to_string()])],
        "{edges:?}"
    );
    // c names floor (super::) but nothing names c back, and its test module's import of a does not count.
    assert!(edges[&vec!["c".to_string()]].contains(&vec!["floor".to_string()]));
    assert!(!edges[&vec!["c".to_string()]].contains(&vec!["a".to_string()]));
    assert!(lengths["c"] > MAX_LINES, "{lengths:?}");
    assert!(lengths["a"] <= MAX_LINES);
}

/// `docs/architecture.md` walks a turn through the files that handle it: every path it names exists (paths
/// outside the repository, `../…`, excepted).
#[test]
fn every_file_the_architecture_page_names_exists() {
    let root = root();
    let page = std::fs::read_to_string(root.join("docs/architecture.md")).expect("docs/architecture.md");
    let named: Vec<&str> = page
        .split('`')
        .skip(1)
        .step_by(2)
        .filter(|quoted| {
            !quoted.starts_with("../")
                && quoted.contains('/')
                && !quoted.contains(' ')
                && [".rs", ".proto", ".md", ".txt"]
                    .iter()
                    .any(|end| quoted.ends_with(end))
        })
        .collect();
    assert!(named.len() >= 20, "the page names only {} files", named.len());
    let missing: Vec<&&str> = named.iter().filter(|path| !root.join(path).is_file()).collect();
    assert!(
        missing.is_empty(),
        "docs/architecture.md names files that do not exist: {missing:?}"
    );
}
