//! evol-arbiter(8), a page per subcommand (nested ones too:
//! evol-arbiter-pool-add(8)) and the completion scripts come from the
//! command line's own definition (`evol-arbiter generate`, hidden): every
//! subcommand `--help` lists has a description, a page, an entry in its
//! parent's page and in the bash, zsh and fish completions, and every page
//! renders without a `man --warnings` warning. man-db is installed by
//! tests/vm/setup-host.sh; its absence is a failure.

#[test]
fn man_pages_and_completions_cover_every_subcommand() {
    let out = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("man-evol-arbiter");
    let _ = std::fs::remove_dir_all(&out);
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_evol-arbiter"));
    if let Err(problems) = cli_docs::check_binary(bin, "8", &out) {
        panic!("{problems}");
    }
}
