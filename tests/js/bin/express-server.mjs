// The reference x402 resource server (@x402/express 2.27) around the same echo handler
// as mindxtrain's benchmark server, using a facilitator reached over HTTP.
//
// usage: node bin/express-server.mjs PORT FACILITATOR_URL PAY_TO ASSET AMOUNT
// Prints "listening" once it accepts connections. POST /echo is paid; POST /free is not.
import express from "express";
import { paymentMiddleware, x402ResourceServer } from "@x402/express";
import { HTTPFacilitatorClient } from "@x402/core/server";
import { ExactEvmScheme } from "@x402/evm/exact/server";

const [port, facilitatorUrl, payTo, asset, amount] = process.argv.slice(2);
if (!amount) {
  console.error("usage: node bin/express-server.mjs PORT FACILITATOR_URL PAY_TO ASSET AMOUNT");
  process.exit(2);
}
const network = "eip155:31337";
const resourceServer = new x402ResourceServer(new HTTPFacilitatorClient({ url: facilitatorUrl })).register(
  network,
  new ExactEvmScheme(),
);
const routes = {
  "POST /echo": {
    accepts: {
      scheme: "exact",
      network,
      payTo,
      maxTimeoutSeconds: 120,
      price: { amount, asset, extra: { name: "USD Coin", version: "2" } },
    },
    description: "echo",
    mimeType: "application/json",
  },
};
const app = express();
app.use(express.json());
app.use(paymentMiddleware(routes, resourceServer));
const echo = (req, res) => res.json({ echo: req.body ?? null });
app.post("/echo", echo);
app.post("/free", echo);
app.listen(Number(port), "127.0.0.1", () => console.log("listening"));
