//! Human-readable quantities in cluster files and on the command line: `300GB/s`,
//! `200Gb/s`, `3.4us`, `80GiB`, `19.5TFLOPS`.
//!
//! Decimal prefixes (k, M, G, T) are powers of 1000, binary ones (Ki, Mi, Gi, Ti) of 1024;
//! a lower-case `b` means bits. Internally time is in microseconds, bandwidth in bytes per
//! second, throughput in FLOP/s.

use std::fmt;

/// A quantity that did not parse.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("'{text}' is not {expected} (examples: {examples})")]
pub struct QuantityError {
    text: String,
    expected: &'static str,
    examples: &'static str,
}

fn split_number(text: &str) -> Option<(f64, &str)> {
    let t = text.trim();
    let end = t
        .find(|c: char| !(c.is_ascii_digit() || matches!(c, '.' | 'e' | 'E' | '+' | '-')))
        .unwrap_or(t.len());
    // `1e3GB/s` parses, but `e` alone as a unit start must not be eaten: back off.
    let (mut num, mut unit) = t.split_at(end);
    while num.ends_with(['e', 'E', '+', '-']) {
        let cut = num.len() - 1;
        (num, unit) = t.split_at(cut);
    }
    let value: f64 = num.parse().ok()?;
    (value.is_finite() && value >= 0.0).then_some((value, unit.trim()))
}

fn prefix_scale(prefix: &str) -> Option<f64> {
    Some(match prefix {
        "" => 1.0,
        "k" | "K" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "Ki" => 1024.0,
        "Mi" => 1024.0 * 1024.0,
        "Gi" => 1024.0 * 1024.0 * 1024.0,
        "Ti" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        _ => return None,
    })
}

/// Bytes per second from `300GB/s`, `200Gb/s` (bits), `1.5GiB/s`, `1e9B/s`.
pub fn parse_bandwidth(text: &str) -> Result<f64, QuantityError> {
    let error = || QuantityError {
        text: text.to_owned(),
        expected: "a bandwidth",
        examples: "300GB/s, 200Gb/s, 1.5GiB/s; from 1B/s to 1e18B/s",
    };
    let (value, unit) = split_number(text).ok_or_else(error)?;
    let per = unit
        .strip_suffix("/s")
        .or_else(|| unit.strip_suffix("ps"))
        .ok_or_else(error)?;
    let (prefix, scale) = if let Some(p) = per.strip_suffix('B') {
        (p, 1.0)
    } else if let Some(p) = per.strip_suffix('b') {
        (p, 1.0 / 8.0)
    } else {
        return Err(error());
    };
    let bytes = value * prefix_scale(prefix).ok_or_else(error)? * scale;
    (MIN_RATE..=MAX_BANDWIDTH)
        .contains(&bytes)
        .then_some(bytes)
        .ok_or_else(error)
}

// Bounds far beyond any machine, so that every time and sum derived from a quantity stays
// finite (`1e308s` would plan `inf` durations that the plan file cannot hold).

/// 1 B/s or FLOP/s: slower rates (`1e-300B/s`) make times that overflow to infinity.
const MIN_RATE: f64 = 1.0;
/// 1 EB/s: a thousand times a GB200 NVL72's NVLink domain.
const MAX_BANDWIDTH: f64 = 1e18;
/// One hour, in µs.
const MAX_LATENCY_US: f64 = 3.6e9;
/// 1 ZFLOP/s: a hundred thousand times a B200's dense FP8.
const MAX_FLOPS: f64 = 1e21;

/// Microseconds from `3.4us`, `3.4µs`, `800ns`, `1ms`, `0s`.
pub fn parse_latency(text: &str) -> Result<f64, QuantityError> {
    let error = || QuantityError {
        text: text.to_owned(),
        expected: "a latency",
        examples: "3.4us, 800ns, 1ms, 0us; at most an hour",
    };
    let (value, unit) = split_number(text).ok_or_else(error)?;
    let scale = match unit {
        "ns" => 1e-3,
        "us" | "µs" => 1.0,
        "ms" => 1e3,
        "s" => 1e6,
        _ => return Err(error()),
    };
    let us = value * scale;
    (us <= MAX_LATENCY_US).then_some(us).ok_or_else(error)
}

/// Bytes from `80GiB`, `32GB`, `4096B`.
pub fn parse_bytes(text: &str) -> Result<u64, QuantityError> {
    let error = || QuantityError {
        text: text.to_owned(),
        expected: "a size in bytes",
        examples: "80GiB, 32GB, 4096B",
    };
    let (value, unit) = split_number(text).ok_or_else(error)?;
    let prefix = unit.strip_suffix('B').ok_or_else(error)?;
    let bytes = value * prefix_scale(prefix).ok_or_else(error)?;
    (bytes >= 1.0 && bytes < 2f64.powi(63))
        .then_some(bytes.round() as u64)
        .ok_or_else(error)
}

/// FLOP/s from `19.5TFLOPS`, `312 TFLOP/s`, `1.2e14FLOPS`.
pub fn parse_flops(text: &str) -> Result<f64, QuantityError> {
    let error = || QuantityError {
        text: text.to_owned(),
        expected: "a throughput",
        examples: "19.5TFLOPS, 312TFLOP/s; from 1FLOPS to 1e21FLOPS",
    };
    let (value, unit) = split_number(text).ok_or_else(error)?;
    let prefix = unit
        .strip_suffix("FLOPS")
        .or_else(|| unit.strip_suffix("FLOP/s"))
        .ok_or_else(error)?;
    let flops = value * prefix_scale(prefix).ok_or_else(error)?;
    (MIN_RATE..=MAX_FLOPS)
        .contains(&flops)
        .then_some(flops)
        .ok_or_else(error)
}

/// Formats bytes per second with a decimal prefix (`300 GB/s`).
pub struct Bandwidth(pub f64);

impl fmt::Display for Bandwidth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (v, p) = decimal(self.0);
        write!(f, "{v} {p}B/s")
    }
}

/// Formats FLOP/s with a decimal prefix (`19.5 TFLOP/s`).
pub struct Throughput(pub f64);

impl fmt::Display for Throughput {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (v, p) = decimal(self.0);
        write!(f, "{v} {p}FLOP/s")
    }
}

/// `x` as a short number (at most 4 significant digits) and a decimal prefix.
fn decimal(x: f64) -> (f64, &'static str) {
    let (scaled, prefix) = [(1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")]
        .into_iter()
        .find(|&(s, _)| x >= s)
        .map_or((x, ""), |(s, p)| (x / s, p));
    let digits = 3 - (scaled.abs().max(1.0).log10().floor() as i32).min(3);
    let round = 10f64.powi(digits);
    ((scaled * round).round() / round, prefix)
}

/// Serializes a byte count kept as `f64` (sums of fractional per-sample shares) as the
/// whole number of bytes it stands for, so machine output never shows `1.5e9` bytes. Pair
/// it with `#[schemars(with = "u64")]`.
pub fn whole_bytes<S: serde::Serializer>(bytes: &f64, serializer: S) -> Result<S::Ok, S::Error> {
    // `as` saturates: negative or NaN → 0, beyond u64 → u64::MAX.
    serializer.serialize_u64(bytes.round() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Whatever a flag or a file field says, a quantity parses to a finite number
        /// within its bounds or is refused; it never panics.
        #[test]
        fn any_text_is_a_bounded_quantity_or_refused(
            number in prop_oneof![
                any::<f64>().prop_map(|x| x.to_string()),
                "[0-9]{0,4}(\\.[0-9]{0,3})?(e[+-]?[0-9]{1,3})?",
                ".{0,8}",
            ],
            unit in prop_oneof![
                prop::sample::select(vec![
                    "", "B/s", "GB/s", "Gbps", "us", "ns", "s", "ms", "GiB", "B", "TFLOPS",
                    "PFLOP/s",
                ])
                .prop_map(str::to_owned),
                ".{0,4}",
            ],
        ) {
            let text = format!("{number}{unit}");
            if let Ok(x) = parse_bandwidth(&text) {
                prop_assert!((MIN_RATE..=MAX_BANDWIDTH).contains(&x), "{text}: {x}");
            }
            if let Ok(x) = parse_latency(&text) {
                prop_assert!((0.0..=MAX_LATENCY_US).contains(&x), "{text}: {x}");
            }
            if let Ok(x) = parse_flops(&text) {
                prop_assert!((MIN_RATE..=MAX_FLOPS).contains(&x), "{text}: {x}");
            }
            if let Ok(x) = parse_bytes(&text) {
                prop_assert!((1..1 << 63).contains(&x), "{text}: {x}");
            }
        }
    }

    #[test]
    fn bandwidths() {
        assert_eq!(parse_bandwidth("300GB/s"), Ok(300e9));
        assert_eq!(parse_bandwidth("200Gb/s"), Ok(25e9));
        assert_eq!(parse_bandwidth("1 GiB/s"), Ok(1073741824.0));
        assert_eq!(parse_bandwidth("1e9B/s"), Ok(1e9));
        assert_eq!(parse_bandwidth("100Gbps"), Ok(12.5e9));
        for bad in [
            "", "GB/s", "1GB", "0GB/s", "-1GB/s", "1XB/s", "nanGB/s", "infGB/s",
        ] {
            assert!(parse_bandwidth(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn latencies() {
        assert_eq!(parse_latency("3.4us"), Ok(3.4));
        assert_eq!(parse_latency("3.4µs"), Ok(3.4));
        assert_eq!(parse_latency("800ns"), Ok(0.8));
        assert_eq!(parse_latency("1ms"), Ok(1000.0));
        assert_eq!(parse_latency("0us"), Ok(0.0));
        assert!(parse_latency("3.4").is_err());
        assert!(parse_latency("-1us").is_err());
        // Finite values whose product is not, or is beyond any machine.
        for bad in ["1e308s", "2h", "3601s", "1e300ms"] {
            assert!(parse_latency(bad).is_err(), "{bad}");
        }
        assert!(parse_bandwidth("1e308GB/s").is_err());
        assert!(parse_bandwidth("2000PB/s").is_err());
        assert!(parse_flops("1e300PFLOPS").is_err());
        assert!(parse_bandwidth("1e-300B/s").is_err());
        assert!(parse_flops("1e-300FLOPS").is_err());
    }

    #[test]
    fn sizes_and_throughputs() {
        assert_eq!(parse_bytes("80GiB"), Ok(80 << 30));
        assert_eq!(parse_bytes("32GB"), Ok(32_000_000_000));
        assert!(parse_bytes("0B").is_err());
        assert!(parse_bytes("1e30B").is_err());
        assert_eq!(parse_flops("19.5TFLOPS"), Ok(19.5e12));
        assert_eq!(parse_flops("312 TFLOP/s"), Ok(312e12));
        assert!(parse_flops("312T").is_err());
    }

    #[test]
    fn display() {
        assert_eq!(Bandwidth(300e9).to_string(), "300 GB/s");
        assert_eq!(Bandwidth(12.5e9).to_string(), "12.5 GB/s");
        assert_eq!(Throughput(19.5e12).to_string(), "19.5 TFLOP/s");
        assert_eq!(Throughput(989.4e12).to_string(), "989.4 TFLOP/s");
    }
}
