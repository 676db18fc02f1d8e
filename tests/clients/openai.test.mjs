// The official OpenAI SDK against a running bloomery-serve (BLOOMERY_URL, e.g.
// http://127.0.0.1:8080): chat completions plain and streamed, completions plain and
// streamed, the model list, logprobs, and an error the SDK turns into its exception.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import OpenAI from 'openai';

const base = process.env.BLOOMERY_URL;
if (!base) throw new Error('BLOOMERY_URL is not set: the address of a running bloomery-serve');
const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: process.env.BLOOMERY_API_KEY || 'none', maxRetries: 0, timeout: 60000 });
const messages = [{ role: 'user', content: 'Write one short sentence about rivers.' }];

test('models.list names the served model', async () => {
  const page = await client.models.list();
  assert.ok(page.data.length >= 1);
  assert.equal(typeof page.data[0].id, 'string');
});

test('chat.completions.create', async () => {
  const r = await client.chat.completions.create({ model: 'any', messages, max_tokens: 5, temperature: 0, ignore_eos: true });
  assert.equal(r.object, 'chat.completion');
  assert.equal(r.choices.length, 1);
  assert.equal(r.choices[0].message.role, 'assistant');
  assert.equal(typeof r.choices[0].message.content, 'string');
  assert.equal(r.choices[0].finish_reason, 'length');
  assert.equal(r.usage.completion_tokens, 5);
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + 5);
});

test('chat.completions.create stream matches the plain answer', async () => {
  const plain = await client.chat.completions.create({ model: 'any', messages, max_tokens: 8, temperature: 0, ignore_eos: true });
  const stream = await client.chat.completions.create({
    model: 'any', messages, max_tokens: 8, temperature: 0, ignore_eos: true, stream: true,
    stream_options: { include_usage: true },
  });
  let text = '';
  let finish = null;
  let usage = null;
  let first = true;
  for await (const chunk of stream) {
    assert.equal(chunk.object, 'chat.completion.chunk');
    if (chunk.usage) usage = chunk.usage;
    if (!chunk.choices.length) continue;
    const c = chunk.choices[0];
    if (first) { assert.equal(c.delta.role, 'assistant'); first = false; }
    text += c.delta.content ?? '';
    if (c.finish_reason) finish = c.finish_reason;
  }
  assert.equal(text, plain.choices[0].message.content);
  assert.equal(finish, 'length');
  assert.ok(usage, 'include_usage gave no usage chunk');
  assert.equal(usage.completion_tokens, 8);
});

test('chat.completions.create with logprobs', async () => {
  const r = await client.chat.completions.create({ model: 'any', messages, max_tokens: 3, temperature: 0, ignore_eos: true, logprobs: true, top_logprobs: 2 });
  const items = r.choices[0].logprobs.content;
  assert.equal(items.length, 3);
  for (const it of items) {
    assert.ok(it.logprob <= 0);
    assert.equal(it.top_logprobs.length, 2);
    assert.equal(it.token, it.top_logprobs[0].token);
  }
});

test('completions.create', async () => {
  const r = await client.completions.create({ model: 'any', prompt: 'The old lighthouse keeper', max_tokens: 4, temperature: 0, ignore_eos: true });
  assert.equal(r.object, 'text_completion');
  assert.equal(typeof r.choices[0].text, 'string');
  assert.equal(r.choices[0].finish_reason, 'length');
  assert.equal(r.usage.completion_tokens, 4);
});

test('completions.create stream matches the plain answer', async () => {
  const plain = await client.completions.create({ model: 'any', prompt: 'The old lighthouse keeper', max_tokens: 6, temperature: 0, ignore_eos: true });
  const stream = await client.completions.create({ model: 'any', prompt: 'The old lighthouse keeper', max_tokens: 6, temperature: 0, ignore_eos: true, stream: true });
  let text = '';
  for await (const chunk of stream) {
    if (chunk.choices.length) text += chunk.choices[0].text ?? '';
  }
  assert.equal(text, plain.choices[0].text);
});

test('a refused request raises BadRequestError with the message', async () => {
  await assert.rejects(
    client.chat.completions.create({ model: 'any', messages: [], max_tokens: 2 }),
    (e) => e instanceof OpenAI.BadRequestError && e.status === 400 && /messages/i.test(e.message),
  );
  await assert.rejects(
    client.chat.completions.create({ model: 'any', messages, n: 65, max_tokens: 2 }),
    (e) => e instanceof OpenAI.BadRequestError && e.status === 400 && /'n'/.test(e.message),
  );
});

test('n choices, plain and streamed', async () => {
  const r = await client.chat.completions.create({ model: 'any', messages, n: 3, max_tokens: 3, ignore_eos: true, seed: 7 });
  assert.deepEqual(r.choices.map((c) => c.index), [0, 1, 2]);
  assert.equal(r.usage.completion_tokens, 9);
  const stream = await client.completions.create({ model: 'any', prompt: 'The old lighthouse keeper', n: 2, max_tokens: 3, ignore_eos: true, stream: true });
  const texts = ['', ''];
  const finished = [];
  for await (const chunk of stream) {
    for (const c of chunk.choices) {
      texts[c.index] += c.text ?? '';
      if (c.finish_reason) finished.push(c.index);
    }
  }
  assert.deepEqual(finished, [0, 1]);
  assert.ok(texts[0].length > 0 && texts[1].length > 0);
});

test('chat.completions.create with tools and a tool history', async () => {
  const tools = [{ type: 'function', function: { name: 'get_weather', description: 'The weather in a city', parameters: { type: 'object', properties: { city: { type: 'string' } } } } }];
  const history = [
    { role: 'user', content: 'Weather in Oslo?' },
    { role: 'assistant', content: null, tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Oslo"}' } }] },
    { role: 'tool', tool_call_id: 'call_1', content: '-3 C' },
  ];
  const r = await client.chat.completions.create({ model: 'any', messages: history, tools, max_tokens: 4, temperature: 0 });
  assert.equal(r.choices.length, 1);
  assert.ok(['stop', 'length', 'tool_calls'].includes(r.choices[0].finish_reason));
  // a forced call: the grammar writes <tool_call>; 4 tokens cannot finish it
  const f = await client.chat.completions.create({ model: 'any', messages: history, tools, tool_choice: 'required', max_tokens: 4 });
  assert.ok(['length', 'tool_calls'].includes(f.choices[0].finish_reason));
  await assert.rejects(
    client.chat.completions.create({ model: 'any', messages: history, tools, tool_choice: { type: 'function', function: { name: 'fly' } }, max_tokens: 4 }),
    (e) => e instanceof OpenAI.BadRequestError && /fly/.test(e.message),
  );
});

test('responses.create: a response object with the message and its usage', async () => {
  const r = await client.responses.create({ model: 'any', input: 'Write one short sentence about rivers.', instructions: 'Be brief.', max_output_tokens: 5, temperature: 0, ignore_eos: true });
  assert.equal(r.object, 'response');
  assert.equal(r.status, 'incomplete');
  assert.equal(r.incomplete_details.reason, 'max_output_tokens');
  const msg = r.output.find((o) => o.type === 'message');
  assert.equal(msg.role, 'assistant');
  assert.equal(msg.content[0].type, 'output_text');
  assert.equal(r.output_text, msg.content[0].text); // the SDK's own join of the output
  assert.equal(r.usage.output_tokens, 5);
  assert.equal(r.usage.total_tokens, r.usage.input_tokens + 5);
});

test('responses.create stream: the named events and the same text', async () => {
  const args = { model: 'any', input: [{ role: 'user', content: [{ type: 'input_text', text: 'Write one short sentence about rivers.' }] }], max_output_tokens: 6, temperature: 0, ignore_eos: true };
  const plain = await client.responses.create(args);
  const stream = await client.responses.create({ ...args, stream: true });
  const kinds = [];
  let text = '';
  let last = null;
  let seq = -1;
  for await (const ev of stream) {
    if (kinds[kinds.length - 1] !== ev.type) kinds.push(ev.type);
    assert.equal(ev.sequence_number, seq + 1);
    seq = ev.sequence_number;
    if (ev.type === 'response.output_text.delta') text += ev.delta;
    last = ev;
  }
  assert.deepEqual(kinds, ['response.created', 'response.in_progress', 'response.output_item.added', 'response.content_part.added', 'response.output_text.delta', 'response.output_text.done', 'response.content_part.done', 'response.output_item.done', 'response.incomplete']);
  assert.equal(text, plain.output_text);
  assert.equal(last.response.output_text ?? last.response.output[0].content[0].text, plain.output_text);
});

test('responses with function tools and a call history; a stored response is refused', async () => {
  const tools = [{ type: 'function', name: 'get_weather', description: 'The weather in a city', parameters: { type: 'object', properties: { city: { type: 'string' } } }, strict: false }];
  const input = [
    { role: 'user', content: 'Weather in Oslo?' },
    { type: 'function_call', call_id: 'call_1', name: 'get_weather', arguments: '{"city":"Oslo"}' },
    { type: 'function_call_output', call_id: 'call_1', output: '-3 C' },
  ];
  const r = await client.responses.create({ model: 'any', input, tools, max_output_tokens: 4, temperature: 0 });
  assert.ok(['completed', 'incomplete'].includes(r.status));
  await assert.rejects(
    client.responses.create({ model: 'any', input: 'Hi', previous_response_id: 'resp_123', max_output_tokens: 2 }),
    (e) => e instanceof OpenAI.BadRequestError && /previous_response_id/.test(e.message),
  );
});
