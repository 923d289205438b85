//! FP8 E4M3 as compressed-tensors, torch's `float8_e4m3fn` and vLLM store it: 1 sign, 4 exponent
//! (bias 7) and 3 mantissa bits, subnormals, no infinities, `0x7F`/`0xFF` NaN, ±448 the largest
//! finite value. The codec is the `float8` crate's (the one candle's F8E4M3 tensors use, a port
//! of CUDA's `__nv_cvt_double_to_fp8`): round to nearest, ties to even, and saturation to ±448
//! beyond the largest value, which is what quantizing a scaled weight needs (a scale rounded to
//! bf16 may put a row's largest weight a hair above 448).

use float8::F8E4M3;

/// The largest finite E4M3 value: a scale maps a row's largest magnitude here.
pub const E4M3_MAX: f32 = 448.0;

/// The nearest E4M3 code to `x` (ties to even), ±448 for anything beyond.
pub fn encode(x: f32) -> F8E4M3 {
    F8E4M3::from_f32(x)
}

/// The value of `code` (exact: every E4M3 value is an f32).
pub fn decode(code: F8E4M3) -> f32 {
    code.to_f32()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The value of an E4M3 bit pattern from its fields, written from the format's definition
    /// (OCP 8-bit floating point, E4M3), independently of the crate.
    fn reference(code: u8) -> f32 {
        let sign = if code & 0x80 != 0 { -1.0 } else { 1.0 };
        let exponent = i32::from((code >> 3) & 0x0F);
        let mantissa = f32::from(code & 0x07);
        if exponent == 0x0F && code & 0x07 == 0x07 {
            return f32::NAN;
        }
        if exponent == 0 {
            sign * mantissa / 8.0 * 2f32.powi(-6)
        } else {
            sign * (1.0 + mantissa / 8.0) * 2f32.powi(exponent - 7)
        }
    }

    #[test]
    fn every_code_decodes_to_its_defined_value_and_encodes_back() {
        for code in 0..=255u8 {
            let want = reference(code);
            let got = decode(F8E4M3::from_bits(code));
            if want.is_nan() {
                assert!(got.is_nan(), "code {code:#04x} decodes to {got}, not NaN");
                continue;
            }
            assert_eq!(got.to_bits(), want.to_bits(), "code {code:#04x}: {got} vs {want}");
            assert_eq!(encode(want).to_bits(), code, "{want} does not encode back to {code:#04x}");
        }
        assert_eq!(reference(0x7E), E4M3_MAX);
    }

    #[test]
    fn values_between_codes_round_to_the_nearest_and_ties_to_even() {
        // Consecutive positive finite codes 0x00..=0x7E, in increasing order.
        for low in 0..0x7Eu8 {
            let (a, b) = (reference(low), reference(low + 1));
            let mid = (a + b) / 2.0;
            let even = if low % 2 == 0 { low } else { low + 1 };
            assert_eq!(encode(mid).to_bits(), even, "the tie {mid} between {a} and {b}");
            let step = (b - a) / 8.0;
            assert_eq!(encode(mid - step).to_bits(), low, "{} is nearer {a}", mid - step);
            assert_eq!(encode(mid + step).to_bits(), low + 1, "{} is nearer {b}", mid + step);
            assert_eq!(encode(-(mid + step)).to_bits(), 0x80 | (low + 1), "the sign is kept");
        }
    }

    #[test]
    fn magnitudes_beyond_448_saturate() {
        for x in [448.0f32, 449.0, 464.0, 500.0, 1e6, f32::MAX, f32::INFINITY] {
            assert_eq!(encode(x).to_bits(), 0x7E, "{x}");
            assert_eq!(encode(-x).to_bits(), 0xFE, "-{x}");
        }
    }
}
