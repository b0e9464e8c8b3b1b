// How the compiler optimised this binary, as `crproxy --version` states it. The
// build script (build.rs) reads it from the flags Cargo passes the compiler and
// includes this file, so the rule has one place and its tests run with the
// library's.

/// A build that used a recorded profile (`-Cprofile-use`, scripts/pgo-build):
/// what the image ships and scripts/bench measures.
pub const PROFILE_GUIDED: &str = "profile-guided";
/// A build that records a profile (`-Cprofile-generate`): slower, for training only.
pub const INSTRUMENTED: &str = "instrumented";
/// Any other build, such as `cargo build --release`.
pub const PLAIN: &str = "plain";

/// Which of the above `encoded_flags` make: Cargo's `CARGO_ENCODED_RUSTFLAGS`,
/// the compiler's flags separated by 0x1f, where a codegen option is written
/// `-Cname=v`, `-C name=v`, `--codegen name=v` or `--codegen=name=v`.
pub fn optimisation(encoded_flags: &str) -> &'static str {
    let flags: Vec<&str> = encoded_flags.split('\u{1f}').collect();
    let mut kind = PLAIN;
    for (i, flag) in flags.iter().enumerate() {
        let option = match *flag {
            "-C" | "--codegen" => flags.get(i + 1).copied().unwrap_or_default(),
            _ => flag
                .strip_prefix("--codegen=")
                .or_else(|| flag.strip_prefix("-C"))
                .unwrap_or_default(),
        };
        // (The compiler refuses the two together.)
        if option.starts_with("profile-use=") {
            kind = PROFILE_GUIDED;
        } else if option == "profile-generate" || option.starts_with("profile-generate=") {
            kind = INSTRUMENTED;
        }
    }
    kind
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_profile_flags_name_the_build() {
        let sep = "\u{1f}";
        for (flags, kind) in [
            ("", PLAIN),
            ("-Ctarget-feature=+crt-static", PLAIN),
            ("-Cprofile-use=/t/crproxy.profdata", PROFILE_GUIDED),
            (&format!("-C{sep}profile-use=/t/p.profdata"), PROFILE_GUIDED),
            (&format!("--codegen{sep}profile-use=p"), PROFILE_GUIDED),
            ("--codegen=profile-use=p", PROFILE_GUIDED),
            (
                &format!("-Ctarget-feature=+crt-static{sep}-Cprofile-use=p"),
                PROFILE_GUIDED,
            ),
            ("-Cprofile-generate=/t/raw", INSTRUMENTED),
            ("-Cprofile-generate", INSTRUMENTED),
            (&format!("-C{sep}profile-generate"), INSTRUMENTED),
            // Not the option: a value of another flag, or another option.
            (&format!("--cfg{sep}profile-use=p"), PLAIN),
            ("-Cprofile-sample-use=p", PLAIN),
            ("-Cprofile-generate-x", PLAIN),
            ("-C", PLAIN),
        ] {
            assert_eq!(optimisation(flags), kind, "{flags:?}");
        }
    }
}
