// Pays an x402 endpoint with the real reference client (@x402/fetch + @x402/evm) and
// prints one JSON line per request: {status, body, paymentResponse}.
//
// usage: X402_PAYER_KEY=0x... node bin/pay.mjs URL [--body JSON] [--repeat N] [--payment-id ID]
//          [--allow-asset NETWORK:ADDRESS:MAX_ATOMIC]
// The client refuses tokens outside its default table unless allowed: local TestUSDC needs
// --allow-asset eip155:31337:0x…:1000000 (a per-payment cap in atomic units).
import { x402Client, wrapFetchWithPayment } from "@x402/fetch";
import { decodePaymentResponseHeader } from "@x402/core/http";
import { ExactEvmScheme } from "@x402/evm/exact/client";
import { appendPaymentIdentifierToExtensions } from "@x402/extensions/payment-identifier";
import { privateKeyToAccount } from "viem/accounts";

const args = process.argv.slice(2);
const url = args[0];
const opt = (name, dflt) => {
  const i = args.indexOf(name);
  return i >= 0 ? args[i + 1] : dflt;
};
const body = opt("--body", '{"hello":"x402"}');
const repeat = Number(opt("--repeat", "1"));
const paymentId = opt("--payment-id", undefined);
const allow = opt("--allow-asset", undefined);
const key = process.env.X402_PAYER_KEY;
if (!url || !key) {
  console.error("usage: X402_PAYER_KEY=0x... node bin/pay.mjs URL [--body JSON] [--repeat N] [--payment-id ID]");
  process.exit(2);
}

const client = new x402Client();
client.register("eip155:*", new ExactEvmScheme(privateKeyToAccount(key)));
if (allow) {
  const [ns, id, asset, cap] = allow.split(":");
  client.setSpendControls({ allowedAssets: [{ network: `${ns}:${id}`, asset, maxAmountPerPayment: cap }] });
}
if (paymentId) {
  client.onBeforePaymentCreation(async ({ paymentRequired }) => {
    paymentRequired.extensions ??= {};
    appendPaymentIdentifierToExtensions(paymentRequired.extensions, paymentId);
  });
}
const pay = wrapFetchWithPayment(fetch, client);

for (let i = 0; i < repeat; i++) {
  const res = await pay(url, { method: "POST", headers: { "content-type": "application/json" }, body });
  const header = res.headers.get("PAYMENT-RESPONSE") ?? res.headers.get("X-PAYMENT-RESPONSE");
  const text = await res.text();
  console.log(
    JSON.stringify({
      status: res.status,
      body: text,
      paymentResponse: header ? decodePaymentResponseHeader(header) : null,
    }),
  );
}
