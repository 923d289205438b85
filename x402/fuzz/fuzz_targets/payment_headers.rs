//! Every header decoder on arbitrary bytes: must return, never panic, never allocate more
//! than the size limit allows.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mindxtrain_x402::header;

fuzz_target!(|data: &[u8]| {
    let _ = header::decode_payment_signature(data);
    let _ = header::decode_x_payment(data);
    let _ = header::decode_payment_required(data);
    let _ = header::decode_payment_response(data);
    // The same bytes as the JSON inside a well-formed base64 header.
    use base64_shim::encode;
    let wrapped = encode(data);
    let _ = header::decode_payment_signature(wrapped.as_bytes());
    let _ = header::decode_x_payment(wrapped.as_bytes());
});

mod base64_shim {
    /// Standard padded base64 (kept local so the fuzz crate needs no other dependency).
    pub fn encode(data: &[u8]) -> String {
        const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
        for chunk in data.chunks(3) {
            let b = [chunk[0], *chunk.get(1).unwrap_or(&0), *chunk.get(2).unwrap_or(&0)];
            let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
            for i in 0..4 {
                if i <= chunk.len() {
                    out.push(T[(n >> (18 - 6 * i)) as usize & 63] as char);
                } else {
                    out.push('=');
                }
            }
        }
        out
    }
}
