// Streams one Responses API request with the official `openai` Node SDK and prints, as one JSON
// line, every event's type and sequence number, the text of the deltas and the final response.
// Used by test_openai_node.py: node openai_node_stream.cjs <sdk dir> <base url> <key> <model>
const [sdkDir, baseURL, apiKey, model] = process.argv.slice(2);
const OpenAI = require(require.resolve("openai", { paths: [sdkDir] }));
(async () => {
  const client = new OpenAI({ baseURL, apiKey, maxRetries: 0 });
  const stream = await client.responses.create({
    model,
    input: "Cuéntame algo. [[sim: tokens=24]]",
    stream: true,
  });
  const events = [];
  let text = "";
  let final = null;
  for await (const e of stream) {
    events.push([e.type, e.sequence_number]);
    if (e.type === "response.output_text.delta") text += e.delta;
    if (e.type === "response.completed") final = e.response;
  }
  console.log(JSON.stringify({ events, text, final }));
})().catch((e) => {
  console.error(String(e && e.stack ? e.stack : e));
  process.exit(1);
});
