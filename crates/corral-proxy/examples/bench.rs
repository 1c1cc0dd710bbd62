//! Proxy benchmark: bulk throughput and per-connection latency of a direct
//! loopback connection next to the same traffic through corral's HTTP
//! CONNECT tunnel and its SOCKS5 proxy, measured side by side in one run.
//!
//! Everything stays on 127.0.0.1: the sink servers, the proxy listeners and
//! every address the proxy dials. The policy allows the sink's name
//! (`sink.bench.test`, a static host entry pointing at 127.0.0.1) on the
//! sink ports, and `allow_cidrs = 127.0.0.1/32` so the loopback address
//! passes the proxy's address screen; nothing is resolved through DNS.
//!
//! ```text
//! cargo run --release -p corral-proxy --example bench -- [--gib N] [--rounds N] [--conns N]
//! ```
//!
//! Targets (issue 5): proxied throughput at least 0.5x direct, and less
//! than 0.3 ms added per connection (median of proxied minus median of
//! direct).

use std::error::Error;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use corral_policy::{Cidr, DomainRule, NetworkMode, NetworkPolicy};
use corral_proxy::{code, start, ProxyConfig, ProxyHandle};

type Res<T> = Result<T, Box<dyn Error>>;

/// The sink's name, mapped to 127.0.0.1 by a static host entry.
const SINK_NAME: &str = "sink.bench.test";
/// Size of each write of the bulk sender and each read of the sink.
const CHUNK: usize = 256 * 1024;
/// Size of the request and of the response in the latency test.
const MESSAGE: usize = 64;
/// Throughput target: proxied / direct.
const TARGET_RATIO: f64 = 0.5;
/// Latency target: milliseconds added per connection.
const TARGET_ADDED_MS: f64 = 0.3;
/// Connections per path opened before the latency measurement.
const WARMUP_CONNS: usize = 100;
/// Bytes per path sent before the throughput measurement.
const WARMUP_BYTES: u64 = 128 << 20;

/// How a client reaches the sink.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Path {
    Direct,
    Connect,
    Socks5,
}

impl Path {
    const ALL: [Path; 3] = [Path::Direct, Path::Connect, Path::Socks5];

    fn label(self) -> &'static str {
        match self {
            Path::Direct => "direct",
            Path::Connect => "HTTP CONNECT",
            Path::Socks5 => "SOCKS5",
        }
    }
}

/// Run sizes, from the command line.
struct Options {
    gib: f64,
    rounds: usize,
    conns: usize,
}

fn options() -> Res<Options> {
    let mut o = Options {
        gib: 2.0,
        rounds: 5,
        conns: 2000,
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--gib" => o.gib = value.parse()?,
            "--rounds" => o.rounds = value.parse()?,
            "--conns" => o.conns = value.parse()?,
            _ => return Err(format!("unknown option {flag}: use --gib, --rounds, --conns").into()),
        }
    }
    if o.gib <= 0.0 || o.rounds == 0 || o.conns == 0 {
        return Err("--gib, --rounds and --conns must be positive".into());
    }
    Ok(o)
}

/// Where everything listens.
struct Setup {
    bulk: SocketAddr,
    echo: SocketAddr,
    proxy: ProxyHandle,
}

/// How a sink server handles its connections.
#[derive(Debug, Clone, Copy)]
enum Serving {
    /// A thread per connection (the few, long bulk transfers).
    Threaded,
    /// One connection after the other on the accept thread (the many
    /// short connections of the latency test: no thread start in the
    /// timed path).
    Inline,
}

/// Accepts connections on a loopback port.
fn serve(serving: Serving, handler: fn(TcpStream) -> io::Result<()>) -> Res<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    thread::Builder::new()
        .name("sink-accept".into())
        .spawn(move || {
            for stream in listener.incoming().flatten() {
                let _ = stream.set_nodelay(true);
                match serving {
                    Serving::Inline => {
                        let _ = handler(stream);
                    }
                    Serving::Threaded => {
                        let _ = thread::Builder::new()
                            .name("sink-conn".into())
                            .spawn(move || handler(stream));
                    }
                }
            }
        })?;
    Ok(addr)
}

/// The bulk sink: reads everything until the client's half-close, then
/// answers with the byte count (8 bytes, little-endian) and closes.
fn bulk_sink(mut stream: TcpStream) -> io::Result<()> {
    let mut buf = vec![0u8; CHUNK];
    let mut total: u64 = 0;
    loop {
        match stream.read(&mut buf)? {
            0 => break,
            n => total += n as u64,
        }
    }
    stream.write_all(&total.to_le_bytes())
}

/// The request/response server: reads one request of [`MESSAGE`] bytes,
/// answers [`MESSAGE`] bytes and closes.
fn echo_once(mut stream: TcpStream) -> io::Result<()> {
    let mut request = [0u8; MESSAGE];
    stream.read_exact(&mut request)?;
    stream.write_all(&request)
}

fn setup() -> Res<Setup> {
    let bulk = serve(Serving::Threaded, bulk_sink)?;
    let echo = serve(Serving::Inline, echo_once)?;
    let loopback = std::net::Ipv4Addr::LOCALHOST.into();
    let policy = NetworkPolicy {
        mode: NetworkMode::Allow,
        allow_domains: vec![DomainRule::parse(&format!(
            "{SINK_NAME}:{},{}",
            bulk.port(),
            echo.port()
        ))?],
        allow_cidrs: vec![Cidr::parse("127.0.0.1/32")?],
        hosts: [(SINK_NAME.to_string(), loopback)].into_iter().collect(),
        ..NetworkPolicy::default()
    };
    let http = TcpListener::bind("127.0.0.1:0")?;
    let socks = TcpListener::bind("127.0.0.1:0")?;
    let proxy = start(http, socks, ProxyConfig::new(policy))?;
    Ok(Setup { bulk, echo, proxy })
}

/// Reads until `buf` holds at least `len` bytes.
fn read_at_least(stream: &mut TcpStream, buf: &mut Vec<u8>, len: usize) -> Res<()> {
    let mut chunk = [0u8; 512];
    while buf.len() < len {
        match stream.read(&mut chunk)? {
            0 => return Err("the proxy closed the connection during the handshake".into()),
            n => buf.extend_from_slice(&chunk[..n]),
        }
    }
    Ok(())
}

/// Opens a connection to `port` on the sink, directly or through the proxy
/// (including the proxy's handshake, as a real client does it).
fn open(setup: &Setup, path: Path, port: u16) -> Res<TcpStream> {
    let stream = match path {
        Path::Direct => TcpStream::connect((std::net::Ipv4Addr::LOCALHOST, port))?,
        Path::Connect => {
            let mut s = TcpStream::connect(setup.proxy.http_addr())?;
            s.set_nodelay(true)?;
            let target = format!("{SINK_NAME}:{port}");
            s.write_all(format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").as_bytes())?;
            // The proxy sends nothing after its answer until the sink does,
            // and the sink speaks only after our request.
            let mut head = Vec::new();
            let mut chunk = [0u8; 512];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                match s.read(&mut chunk)? {
                    0 => return Err("the proxy closed the CONNECT tunnel".into()),
                    n => head.extend_from_slice(&chunk[..n]),
                }
            }
            if !head.starts_with(b"HTTP/1.1 200") {
                return Err(format!("CONNECT refused: {}", String::from_utf8_lossy(&head)).into());
            }
            s
        }
        Path::Socks5 => {
            let mut s = TcpStream::connect(setup.proxy.socks_addr())?;
            s.set_nodelay(true)?;
            s.write_all(&[5, 1, 0])?;
            let mut answer = Vec::new();
            read_at_least(&mut s, &mut answer, 2)?;
            if answer[..2] != [5, 0] {
                return Err(format!("SOCKS5 method refused: {answer:?}").into());
            }
            let name = SINK_NAME.as_bytes();
            let mut request = vec![5, 1, 0, 3, u8::try_from(name.len())?];
            request.extend_from_slice(name);
            request.extend_from_slice(&port.to_be_bytes());
            s.write_all(&request)?;
            answer.clear();
            read_at_least(&mut s, &mut answer, 10)?;
            if answer[1] != 0 {
                return Err(format!("SOCKS5 request refused with reply {}", answer[1]).into());
            }
            s
        }
    };
    stream.set_nodelay(true)?;
    Ok(stream)
}

/// Sends `bytes` to the bulk sink over `path`; returns the seconds from
/// the first byte written to the sink's confirmation of the count.
fn transfer(setup: &Setup, path: Path, bytes: u64) -> Res<f64> {
    let mut s = open(setup, path, setup.bulk.port())?;
    let chunk = vec![0x5au8; CHUNK];
    let started = Instant::now();
    let mut left = bytes;
    while left > 0 {
        let n = usize::try_from(left.min(CHUNK as u64))?;
        s.write_all(&chunk[..n])?;
        left -= n as u64;
    }
    s.shutdown(Shutdown::Write)?;
    let mut count = [0u8; 8];
    s.read_exact(&mut count)?;
    let secs = started.elapsed().as_secs_f64();
    let got = u64::from_le_bytes(count);
    if got != bytes {
        return Err(format!("{}: the sink received {got} of {bytes} bytes", path.label()).into());
    }
    Ok(secs)
}

/// One connection: open (with the proxy handshake), one request, one
/// response. Returns the time up to the complete response; the close is
/// not timed.
fn round_trip(setup: &Setup, path: Path) -> Res<Duration> {
    let started = Instant::now();
    let mut s = open(setup, path, setup.echo.port())?;
    let request = [0x42u8; MESSAGE];
    s.write_all(&request)?;
    let mut response = [0u8; MESSAGE];
    s.read_exact(&mut response)?;
    let took = started.elapsed();
    if response != request {
        return Err(format!("{}: wrong response", path.label()).into());
    }
    drop(s);
    Ok(took)
}

fn median(sorted: &[f64]) -> f64 {
    let n = sorted.len();
    if n % 2 == 1 {
        sorted[n / 2]
    } else {
        (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
    }
}

/// Nearest-rank percentile of sorted values.
fn percentile(sorted: &[f64], p: f64) -> f64 {
    // why: a float-to-int `as` saturates (NaN gives 0) and there is no
    // checked float conversion; the rank is clamped to 1..=len below.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let rank = (p / 100.0 * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn gib_per_s(bytes: u64, secs: f64) -> f64 {
    bytes as f64 / f64::from(1u32 << 30) / secs
}

/// CPU seconds used so far: by the whole process, by the main (client)
/// thread and by the proxy's thread; the sink threads are the rest.
#[derive(Debug, Clone, Copy, Default)]
struct Cpu {
    total: f64,
    client: f64,
    proxy: f64,
}

/// utime + stime in seconds from a `/proc/.../stat` line (USER_HZ = 100
/// on Linux), and the thread's name.
fn stat_cpu(path: &str) -> Option<(String, f64)> {
    let text = std::fs::read_to_string(path).ok()?;
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let name = text.get(open + 1..close)?.to_string();
    let fields: Vec<&str> = text.get(close + 1..)?.split_whitespace().collect();
    // Fields 14 and 15 of stat(5); the first after ')' is field 3.
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some((name, ticks as f64 / 100.0))
}

fn cpu_now() -> Cpu {
    let mut cpu = Cpu::default();
    if let Some((_, total)) = stat_cpu("/proc/self/stat") {
        cpu.total = total;
    }
    if let Some((_, client)) = stat_cpu("/proc/thread-self/stat") {
        cpu.client = client;
    }
    if let Ok(tasks) = std::fs::read_dir("/proc/self/task") {
        for task in tasks.flatten() {
            let path = task.path().join("stat");
            if let Some((name, secs)) = stat_cpu(&path.to_string_lossy()) {
                if name == "corral-proxy" {
                    cpu.proxy += secs;
                }
            }
        }
    }
    cpu
}

/// Throughput results of one path.
#[derive(Debug, Clone, Default)]
struct Bulk {
    /// GiB/s of each round.
    rates: Vec<f64>,
    /// Seconds of all rounds together.
    wall: f64,
    /// CPU seconds of all rounds together.
    cpu: Cpu,
}

/// Bulk throughput per path (in [`Path::ALL`] order): `rounds` rounds,
/// each sending `bytes` over every path, the order rotated from round to
/// round.
fn throughput(setup: &Setup, bytes: u64, rounds: usize) -> Res<Vec<Bulk>> {
    for path in Path::ALL {
        transfer(setup, path, WARMUP_BYTES.min(bytes))?;
    }
    let mut bulk = vec![Bulk::default(); Path::ALL.len()];
    for round in 0..rounds {
        for k in 0..Path::ALL.len() {
            let i = (round + k) % Path::ALL.len();
            let before = cpu_now();
            let secs = transfer(setup, Path::ALL[i], bytes)?;
            let after = cpu_now();
            let b = &mut bulk[i];
            b.rates.push(gib_per_s(bytes, secs));
            b.wall += secs;
            b.cpu.total += after.total - before.total;
            b.cpu.client += after.client - before.client;
            b.cpu.proxy += after.proxy - before.proxy;
        }
    }
    Ok(bulk)
}

/// Per-connection times in ms per path; the paths take turns, connection
/// by connection, so drift on the machine hits all of them alike.
fn latency(setup: &Setup, conns: usize) -> Res<Vec<Vec<f64>>> {
    for _ in 0..WARMUP_CONNS {
        for path in Path::ALL {
            round_trip(setup, path)?;
        }
    }
    let mut times = vec![Vec::with_capacity(conns); Path::ALL.len()];
    for n in 0..conns {
        for k in 0..Path::ALL.len() {
            let i = (n + k) % Path::ALL.len();
            let took = round_trip(setup, Path::ALL[i])?;
            times[i].push(took.as_secs_f64() * 1e3);
        }
    }
    for t in &mut times {
        t.sort_by(f64::total_cmp);
    }
    Ok(times)
}

fn verdict(pass: bool) -> &'static str {
    if pass {
        "PASS"
    } else {
        "MISS"
    }
}

fn main() -> Res<()> {
    let o = options()?;
    // why: --gib is checked positive; a float-to-int `as` saturates, and
    // there is no checked float conversion.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let bytes = (o.gib * f64::from(1u32 << 30)) as u64;
    let setup = setup()?;
    let cores = thread::available_parallelism().map_or(0, usize::from);
    println!(
        "corral-proxy benchmark: 127.0.0.1 only, {cores} cores, proxy at {} (HTTP) and {} (SOCKS5)",
        setup.proxy.http_addr(),
        setup.proxy.socks_addr()
    );
    println!(
        "policy: allow_domains {SINK_NAME}:{},{}; hosts {SINK_NAME} = 127.0.0.1; allow_cidrs 127.0.0.1/32",
        setup.bulk.port(),
        setup.echo.port()
    );

    let started = Instant::now();
    let bulk = throughput(&setup, bytes, o.rounds)?;
    let tp_secs = started.elapsed().as_secs_f64();
    println!();
    println!(
        "throughput: client -> sink, {:.2} GiB per path per round, {} rounds, order rotated ({tp_secs:.1} s)",
        o.gib, o.rounds
    );
    println!(
        "  {:<14}{:>13}{:>13}{:>11}{:>12}{:>29}",
        "path",
        "median GiB/s",
        "range GiB/s",
        "vs direct",
        "cores busy",
        "CPU s/GiB client/proxy/sink"
    );
    let gib_total = o.gib * o.rounds as f64;
    let mut medians = Vec::new();
    for (path, b) in Path::ALL.iter().zip(&bulk) {
        let mut r = b.rates.clone();
        r.sort_by(f64::total_cmp);
        medians.push(median(&r));
        let med = medians[medians.len() - 1];
        let range = format!("{:.2}-{:.2}", r[0], r[r.len() - 1]);
        let c = b.cpu;
        let per_gib = format!(
            "{:.2}/{:.2}/{:.2}",
            c.client / gib_total,
            c.proxy / gib_total,
            (c.total - c.client - c.proxy) / gib_total
        );
        println!(
            "  {:<14}{med:>13.2}{range:>13}{:>10.2}x{:>12.2}{per_gib:>29}",
            path.label(),
            med / medians[0],
            c.total / b.wall,
        );
    }

    let noisy: Vec<&str> = Path::ALL
        .iter()
        .zip(&bulk)
        .filter(|(_, b)| {
            let max = b.rates.iter().copied().fold(f64::MIN, f64::max);
            let min = b.rates.iter().copied().fold(f64::MAX, f64::min);
            max > 1.3 * min
        })
        .map(|(path, _)| path.label())
        .collect();
    if !noisy.is_empty() {
        println!(
            "  NOTE: rounds differ by > 1.3x for {}: something else used the CPU; rerun on a quiet machine",
            noisy.join(", ")
        );
    }

    let started = Instant::now();
    let times = latency(&setup, o.conns)?;
    let lat_secs = started.elapsed().as_secs_f64();
    println!();
    println!(
        "latency: {} connections per path, interleaved; connect (+ proxy handshake) + {MESSAGE} B request + {MESSAGE} B response ({lat_secs:.1} s)",
        o.conns
    );
    println!(
        "  {:<14}{:>11}{:>9}{:>9}{:>9}{:>15}{:>12}",
        "path", "median ms", "p99 ms", "min ms", "mean ms", "added median", "added p99"
    );
    let stat = |t: &[f64]| {
        (
            median(t),
            percentile(t, 99.0),
            t[0],
            t.iter().sum::<f64>() / t.len() as f64,
        )
    };
    let direct = stat(&times[0]);
    let mut added = Vec::new();
    for (i, path) in Path::ALL.iter().enumerate() {
        let (med, p99, min, mean) = stat(&times[i]);
        added.push(med - direct.0);
        let extra = if i == 0 {
            format!("{:>15}{:>12}", "-", "-")
        } else {
            format!("{:>+15.3}{:>+12.3}", med - direct.0, p99 - direct.1)
        };
        println!(
            "  {:<14}{med:>11.3}{p99:>9.3}{min:>9.3}{mean:>9.3}{extra}",
            path.label()
        );
    }

    let report = setup.proxy.stop_report();
    let allowed = report
        .events
        .iter()
        .filter(|e| e.code == code::ALLOWED)
        .count();
    let proxied = 2 * (WARMUP_CONNS + o.conns) + 2 * (o.rounds + 1);
    println!();
    println!(
        "proxy events: {} recorded ({allowed} allowed), {} dropped; {proxied} proxied connections made",
        report.events.len(),
        report.events_dropped
    );
    if allowed + usize::try_from(report.events_dropped)? < proxied {
        return Err("some proxied connections were not recorded as allowed".into());
    }

    println!();
    println!("targets");
    for i in 1..Path::ALL.len() {
        let ratio = medians[i] / medians[0];
        let pass = ratio >= TARGET_RATIO;
        let how = if pass {
            format!("{:.2}x of the limit to spare", ratio / TARGET_RATIO)
        } else {
            format!(
                "short by {:.2} GiB/s, needs {:.2}x more",
                TARGET_RATIO * medians[0] - medians[i],
                TARGET_RATIO / ratio
            )
        };
        println!(
            "  {}  {} throughput >= {TARGET_RATIO}x direct: {:.2} GiB/s vs {:.2} GiB/s = {ratio:.2}x ({how})",
            verdict(pass),
            Path::ALL[i].label(),
            medians[i],
            medians[0],
        );
    }
    for (path, &add) in Path::ALL.iter().zip(&added).skip(1) {
        let pass = add < TARGET_ADDED_MS;
        let how = if pass {
            format!("{:.3} ms to spare", TARGET_ADDED_MS - add)
        } else {
            format!("over by {:.3} ms", add - TARGET_ADDED_MS)
        };
        println!(
            "  {}  {} added latency < {TARGET_ADDED_MS} ms per connection: {add:+.3} ms median ({how})",
            verdict(pass),
            path.label(),
        );
    }
    Ok(())
}
