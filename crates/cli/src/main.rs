//! The `brand` command (everything is in the library, shared with the
//! Python wheel's `brand` command).

fn main() -> std::process::ExitCode {
    brand_cli::main_with_args(std::env::args_os())
}
