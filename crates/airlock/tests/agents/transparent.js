// The transparent plane's Node client: `https.get`, or `http.get` for an
// http:// URL (neither ever reads the proxy variables), one line per URL:
// "URL STATUS BODY" or "URL ERR why".
const http = require("http");
const https = require("https");

(async () => {
  for (const u of process.argv.slice(2)) {
    await new Promise((done) => {
      (u.startsWith("http:") ? http : https)
        .get(u, { timeout: 20000 }, (res) => {
          let body = "";
          res.on("data", (d) => (body += d));
          res.on("end", () => {
            console.log(`${u} ${res.statusCode} ${body}`);
            done();
          });
        })
        .on("error", (e) => {
          console.log(`${u} ERR ${e.code || e.message}`);
          done();
        });
    });
  }
})();
