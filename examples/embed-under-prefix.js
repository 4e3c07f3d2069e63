// Embeds Model Gateway under /llm/ of an existing node:http server.
//
//   npm run build && node examples/embed-under-prefix.js
//   curl -s http://127.0.0.1:3000/llm/v1/models -H "Authorization: Bearer sk-demo-model-gateway-0000"
//
// The gateway is an ordinary request handler: strip the prefix from req.url and hand it over.
const http = require('node:http');
const { createGateway, demoConfig } = require('model-gateway');

const PREFIX = '/llm';

async function main() {
  // Any config object works here; it is validated exactly as a config file is.
  const gateway = await createGateway(demoConfig());

  const server = http.createServer((req, res) => {
    if (req.url === PREFIX || req.url.startsWith(`${PREFIX}/`) || req.url.startsWith(`${PREFIX}?`)) {
      req.url = req.url.slice(PREFIX.length) || '/';
      return gateway.handler(req, res);
    }
    res.writeHead(200, { 'content-type': 'text/plain' });
    res.end('the host application\n');
  });

  server.listen(Number(process.env.PORT ?? 3000), '127.0.0.1', () => {
    const { port } = server.address();
    process.stdout.write(`${JSON.stringify({ msg: 'listening', url: `http://127.0.0.1:${port}`, gateway: PREFIX })}\n`);
  });

  const stop = async () => {
    server.close();
    server.closeIdleConnections();
    await gateway.close(); // waits for in-flight calls, flushes the ledger
    process.exit(0);
  };
  process.on('SIGTERM', stop);
  process.on('SIGINT', stop);
}

main().catch((err) => {
  process.stderr.write(`${err.message}\n`);
  process.exit(1);
});
