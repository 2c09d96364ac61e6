//! `socket-probe unix PATH` | `socket-probe tcp IP:PORT`: connect once and print `connected`,
//! or `refused: <io::ErrorKind> (os error N)`. The integration tests run it as another user
//! to show who can reach Envoy's admin interface and the xDS server.

use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.as_slice() {
        [kind, path] if kind == "unix" => std::os::unix::net::UnixStream::connect(path).map(drop),
        [kind, address] if kind == "tcp" => std::net::TcpStream::connect(address).map(drop),
        _ => {
            eprintln!("usage: socket-probe unix PATH | socket-probe tcp IP:PORT");
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => println!("connected"),
        Err(e) => println!(
            "refused: {:?} (os error {})",
            e.kind(),
            e.raw_os_error().unwrap_or_default()
        ),
    }
    ExitCode::SUCCESS
}
