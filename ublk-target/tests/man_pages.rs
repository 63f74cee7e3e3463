//! ublk-nvmf(8), a page per subcommand and the completion scripts come from
//! the command line's own definition (`ublk-nvmf generate`, hidden): every
//! subcommand `--help` lists has a description, a page, an entry in the top
//! page and in the bash, zsh and fish completions, and every page renders
//! without a `man --warnings` warning. man-db is installed by
//! tests/vm/setup-host.sh; its absence is a failure.

#[test]
fn man_pages_and_completions_cover_every_subcommand() {
    let out = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("man-ublk-nvmf");
    let _ = std::fs::remove_dir_all(&out);
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_ublk-nvmf"));
    if let Err(problems) = cli_docs::check_binary(bin, "8", &out) {
        panic!("{problems}");
    }
}
