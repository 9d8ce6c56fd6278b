//! `lint`'s module-cycle check: no two modules of a crate import each other, directly or
//! through others (arrows point one way: platform and transport at the bottom, then the engine,
//! then the algorithms; see `docs/architecture.md`).
//!
//! Every `src/**/*.rs` file of every workspace crate is one module (`src/bin` and the test,
//! bench and example targets are crates of their own and are not read). A module depends on
//! another where it names it in a path: `use crate::a::b`, `crate::a::b::f()`, `$crate::a` in a
//! macro, `super::…`, `self::…`, or a child module's name. A re-export (`pub use`,
//! `pub(crate) use`) is not a dependency of the module that re-exports: a path through it is
//! followed to the module that defines the name. Left out: a module's use of itself or of an
//! ancestor (a child module is a part of its parent, often methods of the parent's type, and
//! the parent its facade: the rule is about siblings and unrelated modules), and test code (a
//! module declared `#[cfg(test)]`, an inline `#[cfg(test)] mod … { … }`). Comments and string literals are blanked before reading, so prose and messages do not
//! count. The reader is textual, not rustc's resolver; it errs towards seeing an edge.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// One module's path inside its crate (`[]` is the crate root).
type ModPath = Vec<String>;

/// Fails with every cycle of every crate under `root` (its `crates/*` and `xtask`).
pub(crate) fn check(root: &Path) -> crate::Res {
    let mut report = String::new();
    for krate in crate_dirs(root) {
        for cycle in cycles(&krate.join("src")) {
            report.push_str(&format!("{}: {}\n", krate.display(), cycle));
        }
    }
    if report.is_empty() {
        eprintln!("xtask: no module imports another that imports it back");
        Ok(())
    } else {
        Err(format!(
            "module cycles (break each: move the shared piece down):\n{report}"
        ))
    }
}

fn crate_dirs(root: &Path) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = fs::read_dir(root.join("crates"))
        .map(|rd| rd.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    dirs.push(root.join("xtask"));
    dirs.retain(|d| d.join("src").is_dir());
    dirs.sort();
    dirs
}

/// A module read from its file.
struct Module {
    file: PathBuf,
    /// The file's text with comments and literals blanked.
    text: String,
    /// Names re-exported here (`pub use a::b as c;` → `c` → the path `a::b`, resolved later).
    reexports: BTreeMap<String, ModPath>,
    /// Targets of glob re-exports (`pub use a::*;`).
    glob_reexports: Vec<ModPath>,
    /// Names of the items defined here (functions, types, traits, constants, macros).
    defines: BTreeSet<String>,
    /// Declared `#[cfg(test)]` by its parent.
    test_only: bool,
}

/// One path occurrence, as written, in the module `at` (the file's module or an inline
/// module of it).
struct PathUse {
    at: ModPath,
    segs: Vec<String>,
    line: usize,
    reexport: bool,
}

/// Every cycle among the modules under `src`, each as `a -> b -> … -> a` with the line of the
/// first use along every arrow.
pub(crate) fn cycles(src: &Path) -> Vec<String> {
    let mut modules: BTreeMap<ModPath, Module> = BTreeMap::new();
    let mut files = Vec::new();
    rs_files(src, &mut files);
    for file in files {
        let rel = file.strip_prefix(src).expect("under src");
        let mut segs: ModPath = rel
            .iter()
            .map(|s| s.to_string_lossy().into_owned())
            .collect();
        if segs.first().is_some_and(|s| s == "bin") {
            continue;
        }
        let last = segs.pop().expect("a file name");
        let stem = last.trim_end_matches(".rs").to_string();
        let is_root = segs.is_empty() && (stem == "lib" || stem == "main");
        if stem != "mod" && !is_root {
            segs.push(stem);
        }
        let Ok(raw) = fs::read_to_string(&file) else {
            continue;
        };
        let text = blank(&raw);
        let defines = defined_names(&text);
        modules.insert(
            segs,
            Module {
                file,
                text,
                reexports: BTreeMap::new(),
                glob_reexports: Vec::new(),
                defines,
                test_only: false,
            },
        );
    }
    // Test-only children and the paths of every module.
    let mut uses: BTreeMap<ModPath, Vec<PathUse>> = BTreeMap::new();
    let keys: Vec<ModPath> = modules.keys().cloned().collect();
    for key in &keys {
        let text = modules[key].text.clone();
        for child in test_children(&text) {
            let mut c = key.clone();
            c.push(child);
            if let Some(m) = modules.get_mut(&c) {
                m.test_only = true;
            }
        }
        uses.insert(key.clone(), paths(key, &text));
    }
    // Re-exports, resolved lexically (their targets' own re-exports are followed later).
    for key in &keys {
        for u in &uses[key] {
            if !u.reexport {
                continue;
            }
            let Some(abs) = absolute(&modules, &u.at, &u.segs) else {
                continue;
            };
            let m = modules.get_mut(key).expect("known");
            if u.segs.last().is_some_and(|s| s == "*") {
                let mut target = abs;
                target.pop();
                m.glob_reexports.push(target);
            } else if let Some(name) = u.segs.last() {
                let name = name.strip_prefix("as ").unwrap_or(name);
                m.reexports.insert(name.to_string(), abs);
            }
        }
    }
    // Edges between file modules, each with its first witness.
    let mut edges: BTreeMap<ModPath, BTreeMap<ModPath, String>> = BTreeMap::new();
    for key in &keys {
        if modules[key].test_only {
            continue;
        }
        for u in &uses[key] {
            if u.reexport {
                continue;
            }
            let Some(abs) = absolute(&modules, &u.at, &u.segs) else {
                continue;
            };
            let target = resolve(&modules, &abs, 0);
            // A child's use of its parent (or any ancestor) is not an arrow: a child module is
            // a part of its parent (often methods of the parent's type), the parent its facade.
            if target.len() <= key.len() && key[..target.len()] == target[..]
                || modules[&target].test_only
            {
                continue;
            }
            let witness = format!(
                "{}:{} `{}`",
                modules[key].file.display(),
                u.line,
                u.segs.join("::")
            );
            edges
                .entry(key.clone())
                .or_default()
                .entry(target)
                .or_insert(witness);
        }
    }
    let mut out = Vec::new();
    for scc in strongly_connected(&keys, &edges) {
        if scc.len() < 2 {
            continue;
        }
        let set: BTreeSet<&ModPath> = scc.iter().collect();
        let mut lines = vec![format!(
            "cycle among {}",
            scc.iter().map(name).collect::<Vec<_>>().join(", ")
        )];
        for from in &scc {
            for (to, witness) in edges.get(from).into_iter().flatten() {
                if set.contains(to) {
                    lines.push(format!("    {} -> {}  ({witness})", name(from), name(to)));
                }
            }
        }
        out.push(lines.join("\n"));
    }
    out
}

fn name(m: &ModPath) -> String {
    if m.is_empty() {
        "crate".into()
    } else {
        m.join("::")
    }
}

fn rs_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(rd) = fs::read_dir(dir) else { return };
    let mut entries: Vec<PathBuf> = rd.flatten().map(|e| e.path()).collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            rs_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

/// `text` with comments, string literals and character literals replaced by spaces (newlines
/// kept, so line numbers stay right).
fn blank(text: &str) -> String {
    let c: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let keep_lines = |s: &[char], out: &mut String| {
        for ch in s {
            out.push(if *ch == '\n' { '\n' } else { ' ' });
        }
    };
    while i < c.len() {
        let rest = |k: usize| c.get(i + k).copied().unwrap_or('\0');
        if c[i] == '/' && rest(1) == '/' {
            let end = (i..c.len()).find(|&j| c[j] == '\n').unwrap_or(c.len());
            keep_lines(&c[i..end], &mut out);
            i = end;
        } else if c[i] == '/' && rest(1) == '*' {
            let mut depth = 0;
            let mut j = i;
            while j < c.len() {
                if c[j] == '/' && c.get(j + 1) == Some(&'*') {
                    depth += 1;
                    j += 2;
                } else if c[j] == '*' && c.get(j + 1) == Some(&'/') {
                    depth -= 1;
                    j += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    j += 1;
                }
            }
            let end = j.min(c.len());
            keep_lines(&c[i..end], &mut out);
            i = end;
        } else if (c[i] == 'r' || (c[i] == 'b' && rest(1) == 'r')) && !prev_is_ident(&c, i) && {
            let k = if c[i] == 'b' { 2 } else { 1 };
            let mut h = 0;
            while rest(k + h) == '#' {
                h += 1;
            }
            rest(k + h) == '"' && (h > 0 || rest(k) == '"')
        } {
            let k = if c[i] == 'b' { 2 } else { 1 };
            let mut hashes = 0;
            while rest(k + hashes) == '#' {
                hashes += 1;
            }
            let mut j = i + k + hashes + 1;
            loop {
                if j >= c.len() {
                    break;
                }
                if c[j] == '"' && (0..hashes).all(|h| c.get(j + 1 + h) == Some(&'#')) {
                    j += 1 + hashes;
                    break;
                }
                j += 1;
            }
            let end = j.min(c.len());
            keep_lines(&c[i..end], &mut out);
            i = end;
        } else if c[i] == '"' {
            let mut j = i + 1;
            while j < c.len() && c[j] != '"' {
                if c[j] == '\\' {
                    j += 1;
                }
                j += 1;
            }
            let end = (j + 1).min(c.len());
            keep_lines(&c[i..end], &mut out);
            i = end;
        } else if c[i] == '\'' && (rest(1) == '\\' || (rest(1) != '\0' && rest(2) == '\'')) {
            // A character literal (a lifetime has no closing quote after one character).
            let mut j = i + 1;
            if c[j] == '\\' {
                j += 2;
            } else {
                j += 1;
            }
            while j < c.len() && c[j] != '\'' {
                j += 1;
            }
            let end = (j + 1).min(c.len());
            keep_lines(&c[i..end], &mut out);
            i = end;
        } else {
            out.push(c[i]);
            i += 1;
        }
    }
    out
}

fn prev_is_ident(c: &[char], i: usize) -> bool {
    i > 0 && (c[i - 1].is_alphanumeric() || c[i - 1] == '_')
}

/// Tokens: identifiers (with `$crate` as one), `::`, and single punctuation characters; each
/// with its line.
fn tokens(text: &str) -> Vec<(String, usize)> {
    let c: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut line = 1;
    let mut i = 0;
    while i < c.len() {
        let ch = c[i];
        if ch == '\n' {
            line += 1;
            i += 1;
        } else if ch.is_whitespace() {
            i += 1;
        } else if ch.is_alphanumeric() || ch == '_' || (ch == '$' && c.get(i + 1) == Some(&'c')) {
            let start = i;
            i += 1;
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                i += 1;
            }
            let word: String = c[start..i].iter().collect();
            let word = word.strip_prefix("r#").map(str::to_string).unwrap_or(word);
            out.push((word, line));
        } else if ch == ':' && c.get(i + 1) == Some(&':') {
            out.push(("::".into(), line));
            i += 2;
        } else {
            out.push((ch.to_string(), line));
            i += 1;
        }
    }
    out
}

fn is_ident(t: &str) -> bool {
    t.chars()
        .next()
        .is_some_and(|ch| ch.is_alphabetic() || ch == '_' || ch == '$')
}

/// Children declared `#[cfg(test)] mod name;`.
fn test_children(text: &str) -> Vec<String> {
    let t = tokens(text);
    (0..t.len())
        .filter(|&i| t[i].0 == "mod" && t.get(i + 2).is_some_and(|x| x.0 == ";"))
        .filter(|&i| has_test_attr(&t, i))
        .map(|i| t[i + 1].0.clone())
        .collect()
}

/// Whether the item whose keyword is at `i` (`mod`) carries `#[cfg(test)]` among its
/// attributes (before any `pub`, `pub(crate)`).
fn has_test_attr(t: &[(String, usize)], i: usize) -> bool {
    let mut j = i;
    if j >= 1 && t[j - 1].0 == "pub" {
        j -= 1;
    } else if j >= 4 && t[j - 1].0 == ")" && t[j - 4].0 == "pub" {
        j -= 4;
    }
    while j > 0 && t[j - 1].0 == "]" {
        let mut k = j - 1;
        while k > 0 && t[k].0 != "#" {
            k -= 1;
        }
        let attr: Vec<&str> = t[k..j].iter().map(|x| x.0.as_str()).collect();
        if attr.windows(3).any(|w| w == ["cfg", "(", "test"]) {
            return true;
        }
        j = k;
    }
    false
}

fn defined_names(text: &str) -> BTreeSet<String> {
    let t = tokens(text);
    let mut out = BTreeSet::new();
    for w in t.windows(2) {
        if matches!(
            w[0].0.as_str(),
            "fn" | "struct" | "enum" | "trait" | "type" | "const" | "static" | "union" | "mod"
        ) && is_ident(&w[1].0)
        {
            out.insert(w[1].0.clone());
        }
    }
    for w in t.windows(3) {
        if w[0].0 == "macro_rules" && w[1].0 == "!" {
            out.insert(w[2].0.clone());
        }
    }
    out
}

/// Every path in the module `file_mod`'s text: the trees of `use` items, and the other
/// `a::b` paths (those that begin with `crate`, `$crate`, `self`, `super` or any name: which
/// of them are modules is decided in `absolute`).
fn paths(file_mod: &ModPath, text: &str) -> Vec<PathUse> {
    let t = tokens(text);
    let mut out = Vec::new();
    // Inline modules: (name, brace depth at which its body opened).
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut depth = 0usize;
    let mut pending_mod: Option<String> = None;
    let mut i = 0;
    let at = |inline: &Vec<(String, usize)>| {
        let mut m = file_mod.clone();
        m.extend(inline.iter().map(|(n, _)| n.clone()));
        m
    };
    while i < t.len() {
        let tok = t[i].0.as_str();
        match tok {
            "{" => {
                depth += 1;
                if let Some(n) = pending_mod.take() {
                    inline.push((n, depth));
                }
                i += 1;
            }
            "}" => {
                if inline.last().is_some_and(|(_, d)| *d == depth) {
                    inline.pop();
                }
                depth = depth.saturating_sub(1);
                i += 1;
            }
            "mod" if t.get(i + 1).is_some_and(|x| is_ident(&x.0)) => {
                if t.get(i + 2).is_some_and(|x| x.0 == "{") {
                    if has_test_attr(&t, i) {
                        // A `#[cfg(test)] mod … { … }`: test code, skipped.
                        let mut d = 0;
                        let mut j = i + 2;
                        while j < t.len() {
                            match t[j].0.as_str() {
                                "{" => d += 1,
                                "}" => {
                                    d -= 1;
                                    if d == 0 {
                                        break;
                                    }
                                }
                                _ => {}
                            }
                            j += 1;
                        }
                        i = j + 1;
                        continue;
                    }
                    pending_mod = Some(t[i + 1].0.clone());
                }
                i += 2;
            }
            "use" if i == 0 || t[i - 1].0 != "::" => {
                let reexport = is_reexport(&t, i);
                let end = (i..t.len()).find(|&j| t[j].0 == ";").unwrap_or(t.len());
                let line = t[i].1;
                let mut trees = Vec::new();
                use_tree(&t[i + 1..end], &mut Vec::new(), &mut trees);
                let here = at(&inline);
                for segs in trees {
                    out.push(PathUse {
                        at: here.clone(),
                        segs,
                        line,
                        reexport,
                    });
                }
                i = end + 1;
            }
            _ if is_ident(tok)
                && t.get(i + 1).is_some_and(|x| x.0 == "::")
                && (i == 0 || t[i - 1].0 != "::") =>
            {
                let line = t[i].1;
                let mut segs = vec![tok.to_string()];
                let mut j = i + 1;
                while j + 1 < t.len() && t[j].0 == "::" && is_ident(&t[j + 1].0) {
                    segs.push(t[j + 1].0.clone());
                    j += 2;
                }
                out.push(PathUse {
                    at: at(&inline),
                    segs,
                    line,
                    reexport: false,
                });
                i = j;
            }
            _ => i += 1,
        }
    }
    out
}

/// Whether the `use` at `i` is `pub …use`.
fn is_reexport(t: &[(String, usize)], i: usize) -> bool {
    if i >= 1 && t[i - 1].0 == "pub" {
        return true;
    }
    // `pub(crate) use`, `pub(super) use`, `pub(in path) use`
    if i >= 1 && t[i - 1].0 == ")" {
        let mut k = i - 1;
        while k > 0 && t[k].0 != "(" {
            k -= 1;
        }
        return k >= 1 && t[k - 1].0 == "pub";
    }
    false
}

/// Flattens a use tree (`a::{b, c::d as e, f::*}`) into its paths; an alias is not kept
/// (the path's last name stays, which is what a re-export table needs up to renames).
fn use_tree(t: &[(String, usize)], prefix: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    let mut i = 0;
    let base = prefix.len();
    let mut alias: Option<String> = None;
    while i < t.len() {
        let tok = t[i].0.as_str();
        match tok {
            "{" => {
                // Find the matching brace, split its body on top-level commas.
                let mut d = 0;
                let mut j = i;
                while j < t.len() {
                    if t[j].0 == "{" {
                        d += 1;
                    } else if t[j].0 == "}" {
                        d -= 1;
                        if d == 0 {
                            break;
                        }
                    }
                    j += 1;
                }
                let body = &t[i + 1..j.min(t.len())];
                let mut start = 0;
                let mut d = 0;
                for (k, x) in body.iter().enumerate() {
                    match x.0.as_str() {
                        "{" => d += 1,
                        "}" => d -= 1,
                        "," if d == 0 => {
                            use_tree(&body[start..k], prefix, out);
                            start = k + 1;
                        }
                        _ => {}
                    }
                }
                use_tree(&body[start..], prefix, out);
                prefix.truncate(base);
                return;
            }
            "::" => {}
            "as" => {
                alias = t.get(i + 1).map(|x| x.0.clone());
                i += 1;
            }
            "*" => prefix.push("*".into()),
            _ if is_ident(tok) => prefix.push(tok.to_string()),
            _ => {}
        }
        i += 1;
    }
    if prefix.len() > base {
        let mut p = prefix.clone();
        if let Some(a) = alias {
            // `use a::b as c`: the name is `c`; keep the target path and note the name by
            // pushing the alias after a marker the resolver does not walk.
            if a != "_" {
                p.push(format!("as {a}"));
            }
        }
        out.push(p);
    }
    prefix.truncate(base);
}

/// The absolute path (from the crate root) of `segs` written in module `at`, or `None` where
/// it does not start at a module of this crate.
fn absolute(modules: &BTreeMap<ModPath, Module>, at: &ModPath, segs: &[String]) -> Option<ModPath> {
    let mut segs: Vec<String> = segs
        .iter()
        .filter(|s| !s.starts_with("as "))
        .cloned()
        .collect();
    let first = segs.first()?.clone();
    let mut base: ModPath;
    match first.as_str() {
        "crate" | "$crate" => {
            base = Vec::new();
            segs.remove(0);
        }
        "self" => {
            base = at.clone();
            segs.remove(0);
        }
        "super" => {
            base = at.clone();
            while segs.first().is_some_and(|s| s == "super") {
                base.pop()?;
                segs.remove(0);
            }
        }
        _ => {
            // A child module of `at` (a file module: inline modules are not tracked as targets).
            let mut child = at.clone();
            child.push(first.clone());
            if !modules.contains_key(&child) {
                return None;
            }
            base = at.clone();
        }
    }
    base.extend(segs);
    Some(base)
}

/// The file module that defines the item `abs` names: the longest module prefix, then through
/// that module's re-exports.
fn resolve(modules: &BTreeMap<ModPath, Module>, abs: &ModPath, hops: usize) -> ModPath {
    let mut k = 0;
    while k < abs.len() && modules.contains_key(&abs[..=k].to_vec()) {
        k += 1;
    }
    let module = abs[..k].to_vec();
    if hops > 8 {
        return module;
    }
    let Some(next) = abs.get(k) else {
        return module;
    };
    let m = &modules[&module];
    if m.defines.contains(next) {
        return module;
    }
    if let Some(target) = m.reexports.get(next) {
        let mut t = target.clone();
        t.extend(abs[k + 1..].iter().cloned());
        return resolve(modules, &t, hops + 1);
    }
    for g in &m.glob_reexports {
        if modules
            .get(g)
            .is_some_and(|gm| gm.defines.contains(next) || gm.reexports.contains_key(next))
        {
            let mut t = g.clone();
            t.extend(abs[k..].iter().cloned());
            return resolve(modules, &t, hops + 1);
        }
    }
    module
}

/// Tarjan's strongly connected components.
fn strongly_connected(
    nodes: &[ModPath],
    edges: &BTreeMap<ModPath, BTreeMap<ModPath, String>>,
) -> Vec<Vec<ModPath>> {
    struct St<'a> {
        edges: &'a BTreeMap<ModPath, BTreeMap<ModPath, String>>,
        index: BTreeMap<ModPath, usize>,
        low: BTreeMap<ModPath, usize>,
        on: BTreeSet<ModPath>,
        stack: Vec<ModPath>,
        next: usize,
        out: Vec<Vec<ModPath>>,
    }
    fn visit(s: &mut St, v: &ModPath) {
        s.index.insert(v.clone(), s.next);
        s.low.insert(v.clone(), s.next);
        s.next += 1;
        s.stack.push(v.clone());
        s.on.insert(v.clone());
        let succ: Vec<ModPath> = s
            .edges
            .get(v)
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default();
        for w in succ {
            if !s.index.contains_key(&w) {
                visit(s, &w);
                let lw = s.low[&w];
                let lv = s.low.get_mut(v).expect("visited");
                *lv = (*lv).min(lw);
            } else if s.on.contains(&w) {
                let iw = s.index[&w];
                let lv = s.low.get_mut(v).expect("visited");
                *lv = (*lv).min(iw);
            }
        }
        if s.low[v] == s.index[v] {
            let mut comp = Vec::new();
            loop {
                let w = s.stack.pop().expect("on the stack");
                s.on.remove(&w);
                let done = &w == v;
                comp.push(w);
                if done {
                    break;
                }
            }
            comp.sort();
            s.out.push(comp);
        }
    }
    let mut s = St {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        on: BTreeSet::new(),
        stack: Vec::new(),
        next: 0,
        out: Vec::new(),
    };
    for n in nodes {
        if !s.index.contains_key(n) {
            visit(&mut s, n);
        }
    }
    s.out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blanking_keeps_code_and_lines() {
        let b = blank("a // crate::x\nlet s = \"crate::y\"; 'c'; 'a x /* crate::z */ r#\"q\"#");
        assert!(!b.contains("crate::"));
        assert_eq!(b.lines().count(), 2);
        assert!(b.contains("'a x"));
    }

    #[test]
    fn use_trees_flatten() {
        let t = tokens("crate::{a::{b, c as d}, e::*}");
        let mut out = Vec::new();
        use_tree(&t, &mut Vec::new(), &mut out);
        let joined: Vec<String> = out.iter().map(|p| p.join("::")).collect();
        assert_eq!(joined, ["crate::a::b", "crate::a::c::as d", "crate::e::*"]);
    }

    /// Two siblings naming each other are a cycle; a child naming its parent and a test child
    /// are not.
    #[test]
    fn finds_sibling_cycles_only() {
        let src = std::env::temp_dir().join(format!("xtask-module-cycles-{}", std::process::id()));
        let _ = fs::remove_dir_all(&src);
        fs::create_dir_all(src.join("p")).unwrap();
        let files = [
            ("lib.rs", "mod a; mod b; mod p; pub use a::A;"),
            ("a.rs", "pub struct A; fn f() { crate::b::g(); }"),
            ("b.rs", "pub fn g() {} use super::A; // crate::p::q"),
            (
                "p/mod.rs",
                "mod q; #[cfg(test)] mod tests; pub struct P; use q::Q;",
            ),
            ("p/q.rs", "pub struct Q; use super::P;"),
            ("p/tests.rs", "use super::q::Q;"),
        ];
        for (f, text) in files {
            fs::write(src.join(f), text).unwrap();
        }
        let found = cycles(&src);
        fs::remove_dir_all(&src).unwrap();
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].starts_with("cycle among a, b"), "{found:?}");
    }

    /// The workspace itself: no crate has a module cycle left.
    #[test]
    fn workspace_has_no_module_cycles() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .expect("root");
        check(root).unwrap();
    }
}
