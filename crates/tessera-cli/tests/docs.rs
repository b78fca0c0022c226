//! The documentation checks itself: every relative link in README.md and docs/**/*.md points
//! to a file or folder that exists (and a `#anchor` into a markdown file to one of its
//! headings, slugged as GitHub does), and every `tessera …` or `cargo run -p tessera-cli -- …`
//! command quoted in their shell code blocks parses with the tool's own argument parser
//! (`tessera_cli::try_parse_from`). A failure names the file, the line and the bad link or
//! command.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

/// The repository's root.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("the repository root")
}

/// README.md and every markdown file under docs/, sorted.
fn markdown_files(root: &Path) -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "md") {
                out.push(path);
            }
        }
    }
    let mut files = vec![root.join("README.md")];
    walk(&root.join("docs"), &mut files);
    files.sort();
    files
}

/// A fenced code block: its language and its lines (1-based line numbers).
struct CodeBlock {
    lang: String,
    lines: Vec<(usize, String)>,
}

/// A markdown file split into prose (code blocks blanked out, so line numbers stay) and its
/// fenced code blocks.
struct Markdown {
    prose: String,
    blocks: Vec<CodeBlock>,
}

fn split_markdown(text: &str) -> Markdown {
    let mut prose = String::new();
    let mut blocks = Vec::new();
    let mut open: Option<(String, CodeBlock)> = None;
    for (i, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        let fence = ["```", "~~~"].into_iter().find(|f| trimmed.starts_with(f));
        match (&mut open, fence) {
            (None, Some(f)) => {
                let lang = trimmed[f.len()..].split_whitespace().next().unwrap_or("");
                open = Some((
                    f.to_string(),
                    CodeBlock {
                        lang: lang.to_string(),
                        lines: Vec::new(),
                    },
                ));
            }
            (Some((f, _)), Some(g)) if *f == g && trimmed[g.len()..].trim().is_empty() => {
                blocks.push(open.take().unwrap().1);
            }
            (Some((_, block)), _) => block.lines.push((i + 1, line.to_string())),
            (None, None) => prose.push_str(line),
        }
        prose.push('\n');
    }
    if let Some((_, block)) = open {
        blocks.push(block);
    }
    Markdown { prose, blocks }
}

/// `text` with the contents of inline code spans (`` `…` ``) blanked, newlines kept.
fn without_code_spans(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut in_code = false;
    for c in text.chars() {
        if c == '`' {
            in_code = !in_code;
            out.push(c);
        } else if in_code && c != '\n' {
            out.push(' ');
        } else {
            out.push(c);
        }
    }
    out
}

/// GitHub's anchor for a heading: the rendered text lowercased, spaces to `-`, every other
/// character that is not a letter, a digit, `-` or `_` dropped.
fn slug(heading: &str) -> String {
    // A link in a heading renders as its text: `[text](target)` → `text`.
    let mut text = String::new();
    let mut rest = heading;
    while let Some(open) = rest.find('[') {
        let Some(mid) = rest[open..].find("](") else {
            break;
        };
        let Some(close) = rest[open + mid..].find(')') else {
            break;
        };
        text.push_str(&rest[..open]);
        text.push_str(&rest[open + 1..open + mid]);
        rest = &rest[open + mid + close + 1..];
    }
    text.push_str(rest);
    text.trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            '-' | '_' => Some(c),
            c if c.is_alphanumeric() => Some(c),
            _ => None,
        })
        .collect()
}

/// The anchors of a markdown file's headings, duplicates numbered as GitHub does (`x`, `x-1`).
fn anchors(text: &str) -> HashSet<String> {
    let md = split_markdown(text);
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut out = HashSet::new();
    for line in md.prose.lines() {
        let hashes = line.chars().take_while(|&c| c == '#').count();
        if !(1..=6).contains(&hashes) || !line[hashes..].starts_with(' ') {
            continue;
        }
        let base = slug(line[hashes..].trim().trim_end_matches('#'));
        let n = seen.entry(base.clone()).or_insert(0);
        out.insert(if *n == 0 {
            base.clone()
        } else {
            format!("{base}-{n}")
        });
        *n += 1;
    }
    out
}

/// The link targets of a markdown text, with their line numbers: inline links `[x](target)`
/// and reference definitions `[x]: target`, outside code blocks and code spans.
fn links(text: &str) -> Vec<(usize, String)> {
    let prose = without_code_spans(&split_markdown(text).prose);
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(at) = prose[from..].find("](") {
        let start = from + at + 2;
        let end = prose[start..].find(')').map_or(prose.len(), |e| start + e);
        let target = prose[start..end].split_whitespace().next().unwrap_or("");
        let target = target.trim_start_matches('<').trim_end_matches('>');
        let line = prose[..start].matches('\n').count() + 1;
        out.push((line, target.to_string()));
        from = end;
    }
    // A reference definition starts a block: it follows a blank line or another definition.
    let mut after_break = true;
    for (i, line) in prose.lines().enumerate() {
        let trimmed = line.trim_start();
        let definition = if line.len() - trimmed.len() <= 3 {
            trimmed
                .strip_prefix('[')
                .and_then(|l| l.find("]:"))
                .and_then(|close| trimmed[close + 3..].split_whitespace().next())
        } else {
            None
        };
        match definition {
            Some(target) if after_break => out.push((i + 1, target.to_string())),
            _ => after_break = trimmed.is_empty(),
        }
    }
    out.sort();
    out
}

/// What is wrong with the relative links of `file` (shown as `shown`), whose text is `text`.
fn check_links(file: &Path, shown: &str, text: &str) -> Vec<String> {
    let mut problems = Vec::new();
    let dir = file.parent().unwrap();
    for (line, target) in links(text) {
        if target.is_empty() {
            problems.push(format!("{shown}:{line}: an empty link target"));
            continue;
        }
        if target.contains("://") || target.starts_with("mailto:") {
            continue;
        }
        let (path, anchor) = match target.split_once('#') {
            Some((p, a)) => (p, Some(a)),
            None => (target.as_str(), None),
        };
        let resolved = if path.is_empty() {
            file.to_path_buf()
        } else {
            dir.join(path)
        };
        if !path.is_empty() && !resolved.exists() {
            problems.push(format!(
                "{shown}:{line}: link `{target}`: no file {}",
                resolved.display()
            ));
            continue;
        }
        let Some(anchor) = anchor else { continue };
        if resolved.extension().is_none_or(|e| e != "md") {
            continue;
        }
        let heads = if path.is_empty() {
            anchors(text)
        } else {
            anchors(&std::fs::read_to_string(&resolved).unwrap())
        };
        if !heads.contains(anchor) {
            let mut known: Vec<_> = heads.into_iter().collect();
            known.sort();
            problems.push(format!(
                "{shown}:{line}: link `{target}`: no heading with the anchor #{anchor} in {} (anchors: {})",
                resolved.display(),
                known.join(", ")
            ));
        }
    }
    problems
}

/// A shell block's commands: lines joined at trailing `\`, comments dropped, split into
/// words (quotes removed) and at `|`, `||`, `&&`, `;` and `&`; redirections dropped. Each
/// command comes with the line it starts on.
fn shell_commands(block: &CodeBlock) -> Vec<(usize, Vec<String>)> {
    let mut logical: Vec<(usize, String)> = Vec::new();
    let mut continued = false;
    for (n, line) in &block.lines {
        let (text, more) = match line.trim_end().strip_suffix('\\') {
            Some(t) => (t, true),
            None => (line.as_str(), false),
        };
        if continued {
            let last = logical.last_mut().unwrap();
            last.1.push(' ');
            last.1.push_str(text);
        } else {
            logical.push((*n, text.to_string()));
        }
        continued = more;
    }
    let mut commands = Vec::new();
    for (n, line) in logical {
        for words in split_shell(&line) {
            if !words.is_empty() {
                commands.push((n, words));
            }
        }
    }
    commands
}

/// One logical shell line as commands of words (see [`shell_commands`]).
fn split_shell(line: &str) -> Vec<Vec<String>> {
    let mut commands = vec![Vec::new()];
    let mut word: Option<String> = None;
    let mut skip_next_word = false;
    let mut chars = line.chars().peekable();
    let end_word = |word: &mut Option<String>, commands: &mut Vec<Vec<String>>, skip: &mut bool| {
        if let Some(w) = word.take() {
            if *skip {
                *skip = false;
            } else {
                commands.last_mut().unwrap().push(w);
            }
        }
    };
    while let Some(c) = chars.next() {
        match c {
            '\'' => {
                let w = word.get_or_insert_with(String::new);
                for c in chars.by_ref() {
                    if c == '\'' {
                        break;
                    }
                    w.push(c);
                }
            }
            '"' => {
                let w = word.get_or_insert_with(String::new);
                while let Some(c) = chars.next() {
                    match c {
                        '"' => break,
                        '\\' => {
                            if let Some(e) = chars.next() {
                                if !matches!(e, '"' | '\\' | '$' | '`') {
                                    w.push('\\');
                                }
                                w.push(e);
                            }
                        }
                        c => w.push(c),
                    }
                }
            }
            '\\' => {
                if let Some(e) = chars.next() {
                    word.get_or_insert_with(String::new).push(e);
                }
            }
            '#' if word.is_none() => break,
            c if c.is_whitespace() => end_word(&mut word, &mut commands, &mut skip_next_word),
            '|' | ';' | '&' => {
                end_word(&mut word, &mut commands, &mut skip_next_word);
                if chars.peek() == Some(&c) {
                    chars.next();
                }
                commands.push(Vec::new());
            }
            '>' | '<'
                if word
                    .as_deref()
                    .is_none_or(|w| w.chars().all(|c| c.is_ascii_digit())) =>
            {
                // A redirection (`>`, `2>`, `>>`, `<`): dropped with its target.
                word = None;
                while chars.peek().is_some_and(|c| *c == '>') {
                    chars.next();
                }
                if chars.peek() == Some(&'&') {
                    chars.next();
                    while chars
                        .peek()
                        .is_some_and(|c| c.is_ascii_digit() || *c == '-')
                    {
                        chars.next();
                    }
                    continue;
                }
                // The target is the next word, attached (`>/dev/null`) or not.
                skip_next_word = true;
                if !chars.peek().is_some_and(|c| c.is_whitespace()) {
                    word = Some(String::new());
                }
            }
            c => word.get_or_insert_with(String::new).push(c),
        }
    }
    end_word(&mut word, &mut commands, &mut skip_next_word);
    commands
}

/// The `tessera` argv a shell command runs, if it runs the tool: `tessera …`,
/// `target/release/tessera …`, or `cargo run … -p tessera-cli … -- …`; leading `VAR=value`
/// assignments are skipped.
fn tessera_argv(words: &[String]) -> Option<Vec<String>> {
    let words: Vec<&String> = words
        .iter()
        .skip_while(|w| {
            w.split_once('=').is_some_and(|(k, _)| {
                !k.is_empty() && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            })
        })
        .collect();
    let program = words.first()?;
    if Path::new(program.as_str()).file_name()? == "tessera" {
        let mut argv = vec!["tessera".to_string()];
        argv.extend(words[1..].iter().map(|w| w.to_string()));
        return Some(argv);
    }
    if program.as_str() == "cargo" && words.get(1).is_some_and(|w| w.as_str() == "run") {
        let dashes = words.iter().position(|w| w.as_str() == "--");
        let cargo_args = &words[2..dashes.unwrap_or(words.len())];
        let runs_the_tool = cargo_args.windows(2).any(|p| {
            matches!(
                (p[0].as_str(), p[1].as_str()),
                ("-p" | "--package", "tessera-cli") | ("--bin", "tessera")
            )
        }) || cargo_args
            .iter()
            .any(|a| a.as_str() == "--package=tessera-cli" || a.as_str() == "--bin=tessera");
        if !runs_the_tool {
            return None;
        }
        let mut argv = vec!["tessera".to_string()];
        if let Some(d) = dashes {
            argv.extend(words[d + 1..].iter().map(|w| w.to_string()));
        }
        return Some(argv);
    }
    None
}

/// What is wrong with the `tessera` commands in the shell blocks of `text`, and how many
/// commands were checked.
fn check_commands(shown: &str, text: &str) -> (Vec<String>, usize) {
    let mut problems = Vec::new();
    let mut checked = 0;
    for block in split_markdown(text).blocks {
        if !matches!(
            block.lang.as_str(),
            "sh" | "bash" | "shell" | "console" | "zsh"
        ) {
            continue;
        }
        for (line, words) in shell_commands(&block) {
            let Some(argv) = tessera_argv(&words) else {
                continue;
            };
            checked += 1;
            if let Err(e) = tessera_cli::try_parse_from(&argv) {
                use clap::error::ErrorKind;
                if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
                    continue;
                }
                let why = e.to_string();
                let why = why.lines().next().unwrap_or_default();
                problems.push(format!(
                    "{shown}:{line}: `{}` does not parse: {why}",
                    argv.join(" ")
                ));
            }
        }
    }
    (problems, checked)
}

fn shown(root: &Path, file: &Path) -> String {
    file.strip_prefix(root)
        .unwrap_or(file)
        .display()
        .to_string()
}

#[test]
fn every_relative_link_in_the_docs_points_to_a_file_and_heading_that_exist() {
    let root = root();
    let mut problems = Vec::new();
    let mut checked = 0;
    for file in markdown_files(&root) {
        let text = std::fs::read_to_string(&file).unwrap();
        checked += links(&text).len();
        problems.extend(check_links(&file, &shown(&root, &file), &text));
    }
    assert!(
        problems.is_empty(),
        "broken links:\n{}",
        problems.join("\n")
    );
    assert!(
        checked > 50,
        "only {checked} links found: is the scan broken?"
    );
}

#[test]
fn every_tessera_command_in_the_docs_shell_blocks_parses() {
    let root = root();
    let mut problems = Vec::new();
    let mut checked = HashMap::new();
    for file in markdown_files(&root) {
        let text = std::fs::read_to_string(&file).unwrap();
        let name = shown(&root, &file);
        let (p, n) = check_commands(&name, &text);
        problems.extend(p);
        checked.insert(name, n);
    }
    assert!(
        problems.is_empty(),
        "commands that do not parse:\n{}",
        problems.join("\n")
    );
    // The README's first command and its shell quickstart are among them.
    assert!(
        checked["README.md"] >= 6,
        "only {} tessera commands found in README.md: is the scan broken?",
        checked["README.md"]
    );
}

#[test]
fn a_broken_link_or_anchor_is_reported_with_its_file_and_line() {
    let root = root();
    // As if the text were a page in docs/, beside contract.md.
    let page = root.join("docs/example.md");
    let text = "# A page\n\n[fine](contract.md#guarantees), [here](#a-page)\n\
                see [gone](no-such-page.md)\n\n```sh\n[not a link](nowhere.md)\n```\n\
                and [no heading](contract.md#no-such-heading), `[code](nowhere.md)`\n\
                - a list item that goes on\n  [`not_a_definition`]: nowhere.md\n\n\
                [ref]: missing-ref.md\n";
    let problems = check_links(&page, "docs/example.md", text);
    assert_eq!(problems.len(), 3, "{problems:#?}");
    assert!(problems[0].starts_with("docs/example.md:4: link `no-such-page.md`: no file"));
    assert!(problems[1].starts_with(
        "docs/example.md:9: link `contract.md#no-such-heading`: no heading with the anchor"
    ));
    assert!(problems[2].starts_with("docs/example.md:13: link `missing-ref.md`: no file"));
}

#[test]
fn a_command_that_does_not_parse_is_reported_with_its_file_and_line() {
    let text = "Text.\n\n```sh\ntessera status demo --json\n\
                TESSERA_LOG=debug tessera run --name demo --permits 2 \\\n    --wiat 10s -- true\n\
                cargo run -p tessera-cli -- status demo --watch | head -1\n\
                cargo run -p tessera-testkit --bin tessera-chaos -- --store sqlite\n```\n";
    let (problems, checked) = check_commands("README.md", text);
    assert_eq!(checked, 3);
    assert_eq!(problems.len(), 1, "{problems:#?}");
    assert!(
        problems[0].starts_with(
            "README.md:5: `tessera run --name demo --permits 2 --wiat 10s -- true` does not parse"
        ),
        "{}",
        problems[0]
    );
}

#[test]
fn slugs_follow_githubs_rules() {
    assert_eq!(slug("HTTP: `tessera serve`"), "http-tessera-serve");
    assert_eq!(slug("MySQL / MariaDB"), "mysql--mariadb");
    assert_eq!(slug("A killed waiter's permit"), "a-killed-waiters-permit");
    assert_eq!(
        slug("SQLite (embedded): the boot clock"),
        "sqlite-embedded-the-boot-clock"
    );
    assert_eq!(
        slug("snake_case and [a link](x.md)"),
        "snake_case-and-a-link"
    );
    let heads = anchors("# Title\n## Figures\n```sh\n# not a heading\n```\n## Figures\n");
    let mut heads: Vec<_> = heads.into_iter().collect();
    heads.sort();
    assert_eq!(heads, ["figures", "figures-1", "title"]);
}

#[test]
fn shell_lines_become_words_and_commands() {
    let block = CodeBlock {
        lang: "sh".into(),
        lines: vec![
            (1, "A=1 tessera run --name 'a b' \\".into()),
            (
                2,
                "    -- sh -c \"echo \\\"$X\\\"\" 2>&1 >/dev/null && tessera status # note".into(),
            ),
            (3, "tessera status x > out.txt; tessera delete x &".into()),
        ],
    };
    let commands = shell_commands(&block);
    let words: Vec<Vec<&str>> = commands
        .iter()
        .map(|(_, w)| w.iter().map(String::as_str).collect())
        .collect();
    assert_eq!(
        words,
        [
            vec![
                "A=1",
                "tessera",
                "run",
                "--name",
                "a b",
                "--",
                "sh",
                "-c",
                "echo \"$X\""
            ],
            vec!["tessera", "status"],
            vec!["tessera", "status", "x"],
            vec!["tessera", "delete", "x"],
        ]
    );
    assert_eq!(
        commands.iter().map(|c| c.0).collect::<Vec<_>>(),
        [1, 1, 3, 3]
    );
    assert_eq!(
        tessera_argv(&commands[0].1).unwrap()[..3],
        ["tessera", "run", "--name"]
    );
}
