// The official Anthropic SDK against a running bloomery-serve (BLOOMERY_URL):
// messages.create plain and streamed, the stream helper, countTokens, and errors.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import Anthropic from '@anthropic-ai/sdk';

const base = process.env.BLOOMERY_URL;
if (!base) throw new Error('BLOOMERY_URL is not set: the address of a running bloomery-serve');
const client = new Anthropic({ baseURL: base, apiKey: process.env.BLOOMERY_API_KEY || 'none', maxRetries: 0, timeout: 60000 });
const messages = [{ role: 'user', content: 'Tell me about mountains.' }];
const textOf = (m) => m.content.filter((b) => b.type === 'text').map((b) => b.text).join('');

test('messages.create', async () => {
  const m = await client.messages.create({ model: 'any', max_tokens: 5, messages, system: 'Be brief.', temperature: 0, ignore_eos: true });
  assert.equal(m.type, 'message');
  assert.equal(m.role, 'assistant');
  assert.equal(m.content[0].type, 'text');
  assert.equal(m.stop_reason, 'max_tokens');
  assert.equal(m.usage.output_tokens, 5);
  assert.ok(m.usage.input_tokens > 0);
});

test('messages.create with system blocks and stop_sequences', async () => {
  const base = await client.messages.create({ model: 'any', max_tokens: 16, messages, temperature: 0, ignore_eos: true, system: [{ type: 'text', text: 'Be brief.' }] });
  const text = textOf(base).trim();
  if (text.length < 6) return; // nothing to cut
  const stop = text.slice(Math.floor(text.length / 2), Math.floor(text.length / 2) + 2);
  const m = await client.messages.create({ model: 'any', max_tokens: 16, messages, temperature: 0, ignore_eos: true, system: [{ type: 'text', text: 'Be brief.' }], stop_sequences: [stop] });
  assert.equal(m.stop_reason, 'stop_sequence');
  assert.equal(m.stop_sequence, stop);
  const full = textOf(base);
  assert.equal(textOf(m), full.slice(0, full.indexOf(stop)));
});

test('messages.create stream: the event sequence and the same text', async () => {
  const plain = await client.messages.create({ model: 'any', max_tokens: 6, messages, temperature: 0, ignore_eos: true });
  const stream = await client.messages.create({ model: 'any', max_tokens: 6, messages, temperature: 0, ignore_eos: true, stream: true });
  const kinds = [];
  let text = '';
  let stopReason = null;
  for await (const ev of stream) {
    if (kinds[kinds.length - 1] !== ev.type) kinds.push(ev.type);
    if (ev.type === 'content_block_delta' && ev.delta.type === 'text_delta') text += ev.delta.text;
    if (ev.type === 'message_delta') stopReason = ev.delta.stop_reason;
  }
  assert.deepEqual(kinds.filter((k) => k !== 'ping'), ['message_start', 'content_block_start', 'content_block_delta', 'content_block_stop', 'message_delta', 'message_stop']);
  assert.equal(text, textOf(plain));
  assert.equal(stopReason, 'max_tokens');
});

test('messages.stream helper gives the final message', async () => {
  const plain = await client.messages.create({ model: 'any', max_tokens: 6, messages, temperature: 0, ignore_eos: true });
  const final = await client.messages.stream({ model: 'any', max_tokens: 6, messages, temperature: 0, ignore_eos: true }).finalMessage();
  assert.equal(textOf(final), textOf(plain));
  assert.equal(final.usage.output_tokens, 6);
});

test('messages.countTokens', async () => {
  const c = await client.messages.countTokens({ model: 'any', messages, system: 'Be brief.' });
  const m = await client.messages.create({ model: 'any', max_tokens: 1, messages, system: 'Be brief.', temperature: 0 });
  assert.equal(c.input_tokens, m.usage.input_tokens);
});

test('a refused request raises BadRequestError', async () => {
  await assert.rejects(
    client.messages.create({ model: 'any', max_tokens: 4, messages: [] }),
    (e) => e instanceof Anthropic.BadRequestError && e.status === 400,
  );
});

test('messages.create with tools and a tool history', async () => {
  const tools = [{ name: 'get_weather', description: 'The weather in a city', input_schema: { type: 'object', properties: { city: { type: 'string' } } } }];
  const history = [
    { role: 'user', content: 'Weather in Oslo?' },
    { role: 'assistant', content: [{ type: 'tool_use', id: 'toolu_01', name: 'get_weather', input: { city: 'Oslo' } }] },
    { role: 'user', content: [{ type: 'tool_result', tool_use_id: 'toolu_01', content: '-3 C' }] },
  ];
  const m = await client.messages.create({ model: 'any', max_tokens: 4, messages: history, tools, temperature: 0 });
  assert.equal(m.type, 'message');
  assert.ok(['end_turn', 'max_tokens', 'tool_use'].includes(m.stop_reason));
});
