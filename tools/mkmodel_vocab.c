/* Vocabularies for bloomery-mkmodel (see mkmodel_vocab.h): GPT-2's byte-to-unicode
 * mapping, a greedy BPE learner over a built-in text, the built-in chat templates
 * and special tokens of the Qwen3, GLM-4.5, DeepSeek-V3 and gpt-oss families, and
 * the reader for Hugging Face tokenizer folders. */
#include "mkmodel_vocab.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* Text the built-in merges are learned from. Plain English with a little code and
 * a few numbers, so that the merges look like a real tokenizer's: common words,
 * word pieces, indentation and punctuation runs. */
static const char builtin_text[] =
    "The furnace stood at the edge of the village, a low tower of clay and stone that the "
    "smiths called the bloomery. Every morning they carried charcoal from the forest and ore "
    "from the river bank, and every evening they opened the mouth of the furnace to pull out "
    "the bloom: a spongy lump of iron mixed with slag, still glowing, which they hammered on "
    "the anvil until the slag ran out and the metal was dense and strong.\n\n"
    "It was slow work. A good bloom took a whole day of feeding the fire and working the "
    "bellows, and a bad one could be lost in a moment if the air came too fast or the "
    "charcoal ran short. The older smiths said that you learned more from one ruined bloom "
    "than from ten good ones, because a failure made you look at every step again.\n\n"
    "Children from the houses nearby would come to watch. They asked where the iron came "
    "from, why the fire had to be so hot, and whether the hammer ever broke. The smiths "
    "answered with patience, and sometimes they let the older children pump the bellows for "
    "a while. Some of those children became smiths themselves, and the village never ran "
    "short of people who knew how to make a knife, a hinge, a nail or a plough.\n\n"
    "What is the best way to learn a new skill? Start small, repeat often, and write down "
    "what happened. When something goes wrong, find the first thing that was different from "
    "the last time it worked. Do not change two things at once, and do not trust a result "
    "you cannot reproduce. These rules are old, but they are still true for building "
    "software, for cooking, for music, and for almost anything else people do.\n\n"
    "A model reads text as a list of tokens. Each token is a number, and each number stands "
    "for a piece of a word, a whole word, a space or a sign. The model does not see letters; "
    "it sees the numbers and learns which ones tend to follow which others. Given the "
    "question \"What time is it?\" it might answer \"It is half past ten in the morning.\" "
    "It cannot know the real time, of course, unless someone tells it.\n\n"
    "Here is a short program that counts the words in a file:\n\n"
    "def count_words(path):\n"
    "    counts = {}\n"
    "    with open(path) as f:\n"
    "        for line in f:\n"
    "            for word in line.split():\n"
    "                counts[word] = counts.get(word, 0) + 1\n"
    "    return counts\n\n"
    "int main(int argc, char **argv)\n"
    "{\n"
    "    if (argc < 2) {\n"
    "        fprintf(stderr, \"usage: %s FILE\\n\", argv[0]);\n"
    "        return 1;\n"
    "    }\n"
    "    for (int i = 1; i < argc; i++)\n"
    "        printf(\"%s\\n\", argv[i]);\n"
    "    return 0;\n"
    "}\n\n"
    "The weather this week will be cold and wet in the north, with rain on Monday and "
    "Tuesday and snow on the hills by Thursday. In the south it will stay dry and bright, "
    "with a light wind from the west. Temperatures will be between 3 and 12 degrees during "
    "the day, falling to 1 or 2 at night. The weekend should be calmer, with sunshine on "
    "Saturday and some cloud on Sunday afternoon.\n\n"
    "To make bread, mix 500 grams of flour with 10 grams of salt, 7 grams of yeast and 350 "
    "millilitres of warm water. Knead the dough for ten minutes, until it is smooth, then "
    "leave it to rise for an hour in a warm place. Shape it into a loaf, let it rise again, "
    "and bake it at 220 degrees for about 30 minutes. The bread is ready when it sounds "
    "hollow if you knock on the bottom.\n\n"
    "She looked out of the window and saw that the road was empty. The last bus had gone an "
    "hour ago, and there would not be another one until the morning. She thought about "
    "calling her brother, but he lived far away and would be asleep by now. In the end she "
    "made a cup of tea, sat down by the fire and opened the book she had been meaning to "
    "read for months. It was about a sailor who crossed the ocean alone in a small boat, and "
    "she did not put it down until the sky was light again.\n\n"
    "Questions and answers. Why is the sky blue? Because the air scatters blue light more "
    "than red light. Why do leaves change colour in autumn? Because the trees stop making "
    "the green pigment and the other colours show through. How far away is the moon? About "
    "384,400 kilometres, on average. How many days are there in a year? There are 365, or "
    "366 in a leap year. Thank you for your help! You are welcome; I am happy to help.\n\n"
    "The system is made of three parts: a router that talks to clients, workers that run "
    "the layers of the model on each device, and a host tier that keeps the experts which "
    "do not fit on the cards. The router sends a batch of tokens to the first worker, each "
    "worker passes its results to the next, and the last one returns the logits, from which "
    "the router samples the next token and streams the text back to the user.\n\n"
    "In a chat, the system message sets the rules, the user asks and the assistant answers. "
    "A user may ask the assistant to think first; the assistant then writes its thoughts, "
    "closes them, and gives the answer the user asked for.\n\n"
    "system\nYou are a helpful assistant.\n"
    "user\nWhat is a bloom?\n"
    "assistant\nA bloom is a lump of iron and slag from the furnace.\n"
    "user\nHow hot is the fire?\n"
    "assistant\nHot enough to make the iron soft, but not to melt it.\n"
    "user\nThank you.\n"
    "assistant\nYou are welcome.\n"
    "system\nAnswer in one line.\n"
    "user\nWhat is slag?\n"
    "assistant\nThe stone and ash that the smith hammers out of the bloom.\n";

/* Qwen-style chat template for the built-in vocabulary: <|im_start|>ROLE\n...<|im_end|>
 * turns, earlier assistant reasoning dropped, and an empty think block when the
 * caller turns thinking off. */
static const char qwen_template[] =
    "{%- for message in messages %}\n"
    "{%- set content = message.content if message.content is string else '' %}\n"
    "{%- if message.role == 'assistant' and '</think>' in content %}\n"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') %}\n"
    "{%- endif %}\n"
    "{{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>\\n' }}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "{{- '<|im_start|>assistant\\n' }}\n"
    "{%- if enable_thinking is defined and enable_thinking is false %}\n"
    "{{- '<think>\\n\\n</think>\\n\\n' }}\n"
    "{%- endif %}\n"
    "{%- endif %}\n";

/* Qwen3.5-style chat template for the built-in vocabulary: Qwen's <|im_start|> turns
 * (earlier reasoning dropped, an empty think block when thinking is off), with
 * Qwen3.5's tool form: the tools, one JSON description a line, inside <tools> in the
 * system turn; a call as <tool_call> <function=NAME> and each argument as
 * <parameter=KEY> VALUE </parameter> on lines of their own (string values raw,
 * others as JSON); results inside <tool_response> in a user turn, consecutive ones
 * sharing it. The server reads the call form off "<function=" and "<parameter=".
 * Only the constructs router/template*.c implements are used. */
static const char qwen35_template[] =
    "{%- set has_system = messages | length > 0 and messages[0].role == 'system' %}\n"
    "{%- if tools or has_system %}\n"
    "{{- '<|im_start|>system\\n' }}\n"
    "{%- if has_system and messages[0].content is string %}\n"
    "{{- messages[0].content }}\n"
    "{%- endif %}\n"
    "{%- if tools %}\n"
    "{%- if has_system %}\n"
    "{{- '\\n\\n' }}\n"
    "{%- endif %}\n"
    "{{- 'These functions are available:\\n<tools>\\n' }}\n"
    "{%- for tool in tools %}\n"
    "{{- (tool.function if tool.function is defined else tool) | tojson }}\n"
    "{{- '\\n' }}\n"
    "{%- endfor %}\n"
    "{{- '</tools>\\nTo call one, answer with <tool_call>, then <function=NAME> on a line, each "
    "argument as <parameter=KEY>, its value on the next lines and </parameter>, then </function> "
    "and </tool_call>. Results come back inside <tool_response>.' }}\n"
    "{%- endif %}\n"
    "{{- '<|im_end|>\\n' }}\n"
    "{%- endif %}\n"
    "{%- set ns = namespace(prev='') %}\n"
    "{%- for m in messages %}\n"
    "{%- set content = m.content if m.content is string else '' %}\n"
    "{%- if loop.first and has_system %}\n"
    "{%- elif m.role == 'tool' %}\n"
    "{%- if ns.prev != 'tool' %}\n"
    "{{- '<|im_start|>user' }}\n"
    "{%- endif %}\n"
    "{{- '\\n<tool_response>\\n' + content + '\\n</tool_response>' }}\n"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}\n"
    "{{- '<|im_end|>\\n' }}\n"
    "{%- endif %}\n"
    "{%- elif m.role == 'assistant' %}\n"
    "{%- if '</think>' in content %}\n"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') %}\n"
    "{%- endif %}\n"
    "{{- '<|im_start|>assistant\\n' + content }}\n"
    "{%- if m.tool_calls %}\n"
    "{%- for call in m.tool_calls %}\n"
    "{%- set f = call.function if call.function is defined else call %}\n"
    "{%- if content or not loop.first %}\n"
    "{{- '\\n' }}\n"
    "{%- endif %}\n"
    "{{- '<tool_call>\\n<function=' + f.name + '>\\n' }}\n"
    "{%- if f.arguments is mapping %}\n"
    "{%- for key, value in f.arguments.items() %}\n"
    "{{- '<parameter=' + key + '>\\n' + (value if value is string else value | tojson) + "
    "'\\n</parameter>\\n' }}\n"
    "{%- endfor %}\n"
    "{%- endif %}\n"
    "{{- '</function>\\n</tool_call>' }}\n"
    "{%- endfor %}\n"
    "{%- endif %}\n"
    "{{- '<|im_end|>\\n' }}\n"
    "{%- else %}\n"
    "{{- '<|im_start|>' + m.role + '\\n' + content + '<|im_end|>\\n' }}\n"
    "{%- endif %}\n"
    "{%- set ns.prev = m.role %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "{{- '<|im_start|>assistant\\n' }}\n"
    "{%- if enable_thinking is defined and enable_thinking is false %}\n"
    "{{- '<think>\\n\\n</think>\\n\\n' }}\n"
    "{%- endif %}\n"
    "{%- endif %}\n";

/* GLM-4.5-style chat template for the built-in vocabulary: "[gMASK]<sop>" once, then
 * <|system|>, <|user|>, <|assistant|> and <|observation|> turns with no end marker
 * (generation stops at the next turn's token: <|user|> is eot, <|observation|> eom).
 * The tools, one JSON line each, join the first system turn. An assistant turn is
 * "<think>REASONING</think>\n" and its content (reasoning from reasoning_content or
 * from a <think> block in the content, kept only after the last user turn, as the
 * model saw it while it worked on that turn), then its calls as key/value pairs:
 * string values raw, others as JSON. The server reads the call form off the
 * template's "<arg_key>". Arguments given as a JSON string cannot be taken apart
 * by a template and are written as they came. Consecutive tool results share one
 * <|observation|>. Only the constructs router/template*.c implements are used. */
static const char glm_template[] =
    "{{- '[gMASK]<sop>' }}\n"
    "{%- set ns = namespace(last_user=-1, prev='') %}\n"
    "{%- for m in messages %}\n"
    "{%- if m.role == 'user' %}\n"
    "{%- set ns.last_user = loop.index0 %}\n"
    "{%- endif %}\n"
    "{%- endfor %}\n"
    "{%- set has_system = messages | length > 0 and messages[0].role == 'system' %}\n"
    "{%- if tools or has_system %}\n"
    "{{- '<|system|>\\n' }}\n"
    "{%- if has_system and messages[0].content is string %}\n"
    "{{- messages[0].content }}\n"
    "{%- endif %}\n"
    "{%- if tools %}\n"
    "{%- if has_system %}\n"
    "{{- '\\n\\n' }}\n"
    "{%- endif %}\n"
    "{{- 'These functions are available, one JSON description per line:\\n' }}\n"
    "{%- for tool in tools %}\n"
    "{{- (tool.function if tool.function is defined else tool) | tojson }}\n"
    "{{- '\\n' }}\n"
    "{%- endfor %}\n"
    "{{- 'To call one, write <tool_call> followed by its name, then each argument as "
    "<arg_key>NAME</arg_key> and <arg_value>VALUE</arg_value> on lines of their own, and close "
    "with </tool_call>. Results come back inside <tool_response>.' }}\n"
    "{%- endif %}\n"
    "{%- endif %}\n"
    "{%- for m in messages %}\n"
    "{%- set content = m.content if m.content is string else '' %}\n"
    "{%- if loop.first and has_system %}\n"
    "{%- elif m.role == 'tool' %}\n"
    "{%- if ns.prev != 'tool' %}\n"
    "{{- '<|observation|>\\n' }}\n"
    "{%- endif %}\n"
    "{{- '<tool_response>\\n' + content + '\\n</tool_response>\\n' }}\n"
    "{%- elif m.role == 'assistant' %}\n"
    "{%- set reasoning = m.reasoning_content if m.reasoning_content is string else '' %}\n"
    "{%- if '</think>' in content %}\n"
    "{%- set reasoning = content.split('</think>')[0].split('<think>')[-1] %}\n"
    "{%- set content = content.split('</think>')[-1] %}\n"
    "{%- endif %}\n"
    "{%- if loop.index0 < ns.last_user %}\n"
    "{%- set reasoning = '' %}\n"
    "{%- endif %}\n"
    "{%- set content = content.strip() %}\n"
    "{{- '<|assistant|>\\n<think>' + reasoning.strip() + '</think>\\n' + content }}\n"
    "{%- if m.tool_calls %}\n"
    "{%- for call in m.tool_calls %}\n"
    "{%- set f = call.function if call.function is defined else call %}\n"
    "{%- if content or not loop.first %}\n"
    "{{- '\\n' }}\n"
    "{%- endif %}\n"
    "{{- '<tool_call>' + f.name + '\\n' }}\n"
    "{%- if f.arguments is mapping %}\n"
    "{%- for key, value in f.arguments.items() %}\n"
    "{{- '<arg_key>' + key + '</arg_key>\\n<arg_value>' + "
    "(value if value is string else value | tojson) + '</arg_value>\\n' }}\n"
    "{%- endfor %}\n"
    "{%- elif f.arguments is string and f.arguments.strip() not in ['', '{}'] %}\n"
    "{{- f.arguments.strip() + '\\n' }}\n"
    "{%- endif %}\n"
    "{{- '</tool_call>' }}\n"
    "{%- endfor %}\n"
    "{%- endif %}\n"
    "{%- else %}\n"
    "{{- '<|' + m.role + '|>\\n' + content }}\n"
    "{%- endif %}\n"
    "{%- set ns.prev = m.role %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "{{- '<|assistant|>\\n' }}\n"
    "{%- if enable_thinking is defined and enable_thinking is false %}\n"
    "{{- '<think></think>\\n' }}\n"
    "{%- endif %}\n"
    "{%- endif %}\n";

/* DeepSeek's tags are spelled with U+FF5C (fullwidth vertical line) and U+2581
 * (lower one eighth block); written as escapes so that the source stays ASCII. */
#define DS_BAR "\xef\xbd\x9c"
#define DS_LOW "\xe2\x96\x81"
#define DS_TAG(name) "<" DS_BAR name DS_BAR ">"
#define DS_BOS DS_TAG("begin" DS_LOW "of" DS_LOW "sentence")
#define DS_EOS DS_TAG("end" DS_LOW "of" DS_LOW "sentence")
#define DS_USER DS_TAG("User")
#define DS_ASSISTANT DS_TAG("Assistant")
#define DS_CALLS_BEGIN DS_TAG("tool" DS_LOW "calls" DS_LOW "begin")
#define DS_CALLS_END DS_TAG("tool" DS_LOW "calls" DS_LOW "end")
#define DS_CALL_BEGIN DS_TAG("tool" DS_LOW "call" DS_LOW "begin")
#define DS_CALL_END DS_TAG("tool" DS_LOW "call" DS_LOW "end")
#define DS_SEP DS_TAG("tool" DS_LOW "sep")
#define DS_OUTPUTS_BEGIN DS_TAG("tool" DS_LOW "outputs" DS_LOW "begin")
#define DS_OUTPUTS_END DS_TAG("tool" DS_LOW "outputs" DS_LOW "end")
#define DS_OUTPUT_BEGIN DS_TAG("tool" DS_LOW "output" DS_LOW "begin")
#define DS_OUTPUT_END DS_TAG("tool" DS_LOW "output" DS_LOW "end")

/* DeepSeek-V3.1-style chat template for the built-in vocabulary: BOS, every system
 * message's text (and the tools, one JSON line each, with how to call them), then
 * <｜User｜>TEXT turns and <｜Assistant｜> turns. A past assistant turn is written as
 * the model answered without thinking ("</think>" after the tag), its reasoning
 * dropped, its calls as NAME<｜tool▁sep｜>ARGUMENTS (a JSON string as it came, an
 * object as JSON), and ends with <｜end▁of▁sentence｜>. Tool results follow as
 * <｜tool▁output▁begin｜>TEXT<｜tool▁output▁end｜>, and the assistant's turn goes on
 * after them without a new tag (so no generation prompt follows a result). The
 * generation prompt opens the reply with <think> when enable_thinking is true, else
 * closes the thought at once with </think>. The server reads the call form off the
 * template's <｜tool▁calls▁begin｜> and the absence of a ```json fence. */
static const char deepseek_template[] =
    "{%- set ns = namespace(system='', prev='') %}\n"
    "{%- for m in messages %}\n"
    "{%- if m.role == 'system' and m.content is string %}\n"
    "{%- set ns.system = ns.system + ('\\n\\n' if ns.system else '') + m.content %}\n"
    "{%- endif %}\n"
    "{%- endfor %}\n"
    "{{- bos_token + ns.system }}\n"
    "{%- if tools %}\n"
    "{%- if ns.system %}\n"
    "{{- '\\n\\n' }}\n"
    "{%- endif %}\n"
    "{{- 'Functions you may call, one JSON description per line:\\n' }}\n"
    "{%- for tool in tools %}\n"
    "{{- (tool.function if tool.function is defined else tool) | tojson }}\n"
    "{{- '\\n' }}\n"
    "{%- endfor %}\n"
    "{{- 'To call them, write " DS_CALLS_BEGIN ", then for each call " DS_CALL_BEGIN
    "NAME" DS_SEP "ARGUMENTS" DS_CALL_END " with the arguments as one JSON object, then "
    DS_CALLS_END ". Each result comes back as " DS_OUTPUT_BEGIN "RESULT" DS_OUTPUT_END
    ".' }}\n"
    "{%- endif %}\n"
    "{%- for m in messages %}\n"
    "{%- set content = m.content if m.content is string else '' %}\n"
    "{%- if m.role == 'user' %}\n"
    "{{- '" DS_USER "' + content }}\n"
    "{%- elif m.role == 'assistant' %}\n"
    "{%- if ns.prev != 'tool' %}\n"
    "{{- '" DS_ASSISTANT "</think>' }}\n"
    "{%- endif %}\n"
    "{%- if '</think>' in content %}\n"
    "{%- set content = content.split('</think>')[-1] %}\n"
    "{%- endif %}\n"
    "{{- content }}\n"
    "{%- if m.tool_calls %}\n"
    "{{- '" DS_CALLS_BEGIN "' }}\n"
    "{%- for call in m.tool_calls %}\n"
    "{%- set f = call.function if call.function is defined else call %}\n"
    "{{- '" DS_CALL_BEGIN "' + f.name + '" DS_SEP "' }}\n"
    "{{- f.arguments if f.arguments is string else f.arguments | tojson }}\n"
    "{{- '" DS_CALL_END "' }}\n"
    "{%- endfor %}\n"
    "{{- '" DS_CALLS_END "' }}\n"
    "{%- endif %}\n"
    "{{- '" DS_EOS "' }}\n"
    "{%- elif m.role == 'tool' %}\n"
    "{{- '" DS_OUTPUT_BEGIN "' + content + '" DS_OUTPUT_END "' }}\n"
    "{%- endif %}\n"
    "{%- if m.role != 'system' %}\n"
    "{%- set ns.prev = m.role %}\n"
    "{%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt and ns.prev != 'tool' %}\n"
    "{{- '" DS_ASSISTANT "' }}\n"
    "{%- if enable_thinking is defined and enable_thinking is true %}\n"
    "{{- '<think>' }}\n"
    "{%- else %}\n"
    "{{- '</think>' }}\n"
    "{%- endif %}\n"
    "{%- endif %}\n";

/* gpt-oss (harmony) chat template for the built-in vocabulary. Every message is
 * <|start|>AUTHOR[<|channel|>CHANNEL][ to=RECIPIENT]<|message|>TEXT and an end tag.
 * A system message of this tool's wording comes first (the reasoning effort when
 * the request gives one, the valid channels), then a developer message when there
 * are instructions (every system or developer message's text, in order) or tools
 * (each function as a TypeScript-like type in a "functions" namespace: its
 * description, then its parameters by their JSON schema types, "?" marking the
 * optional ones, enums as unions of their JSON values). User turns are plain
 * messages. A past assistant answer is a final-channel message; the reasoning of
 * the assistant messages after the last user turn (the turn in progress, its calls
 * included) goes before them as an analysis message, earlier reasoning is dropped.
 * A call is a commentary message to=functions.NAME with json arguments ended by
 * <|call|> (text beside the calls a commentary message before them); a tool's
 * result comes from functions.NAME (by the message's name, else the call its
 * tool_call_id names, else the calls in order) to the assistant. The generation
 * prompt is <|start|>assistant, the model writing the channel itself. The server
 * recognises harmony by the template's "<|channel|>". Only the constructs
 * router/template*.c implements are used. */
static const char harmony_template[] =
    "{%- set ns = namespace(last_user=-1, instructions='', calls=[], k=0, name='') %}\n"
    "{%- for m in messages %}\n"
    "{%- if m.role == 'user' %}\n"
    "{%- set ns.last_user = loop.index0 %}\n"
    "{%- elif m.role in ['system', 'developer'] and m.content is string %}\n"
    "{%- set ns.instructions = ns.instructions + ('\\n\\n' if ns.instructions else '') + "
    "m.content %}\n"
    "{%- endif %}\n"
    "{%- endfor %}\n"
    "{{- '<|start|>system<|message|>You are a small synthetic model; your weights are "
    "random, so what you write means nothing.' }}\n"
    "{%- if reasoning_effort is defined and reasoning_effort %}\n"
    "{{- '\\nReasoning: ' + reasoning_effort }}\n"
    "{%- endif %}\n"
    "{{- '\\n\\n# Valid channels: analysis, commentary, final. Channel must be included for "
    "every message.' }}\n"
    "{%- if tools %}\n"
    "{{- '\\nFunction calls belong in the commentary channel.' }}\n"
    "{%- endif %}\n"
    "{{- '<|end|>' }}\n"
    "{%- if ns.instructions or tools %}\n"
    "{{- '<|start|>developer<|message|>' }}\n"
    "{%- if ns.instructions %}\n"
    "{{- '# Instructions\\n\\n' + ns.instructions }}\n"
    "{%- if tools %}\n"
    "{{- '\\n\\n' }}\n"
    "{%- endif %}\n"
    "{%- endif %}\n"
    "{%- if tools %}\n"
    "{{- '# Tools\\n\\n## functions\\n\\nnamespace functions {\\n' }}\n"
    "{%- for tool in tools %}\n"
    "{%- set f = tool.function if tool.function is defined else tool %}\n"
    "{{- '\\n' }}\n"
    "{%- if f.description is defined and f.description %}\n"
    "{{- '// ' + f.description + '\\n' }}\n"
    "{%- endif %}\n"
    "{%- set params = f.parameters if f.parameters is defined and f.parameters else {} %}\n"
    "{%- set props = params.properties if params.properties is defined else {} %}\n"
    "{%- set required = params.required if params.required is defined else [] %}\n"
    "{%- if props %}\n"
    "{{- 'type ' + f.name + ' = (_: {\\n' }}\n"
    "{%- for pname, p in props.items() %}\n"
    "{%- if p.description is defined and p.description %}\n"
    "{{- '// ' + p.description + '\\n' }}\n"
    "{%- endif %}\n"
    "{{- pname + ('' if pname in required else '?') + ': ' }}\n"
    "{%- if p.enum is defined %}\n"
    "{%- for e in p.enum %}\n"
    "{{- (' | ' if not loop.first else '') + (e | tojson) }}\n"
    "{%- endfor %}\n"
    "{%- elif p.type is defined and p.type in ['integer', 'number'] %}\n"
    "{{- 'number' }}\n"
    "{%- elif p.type is defined and p.type in ['string', 'boolean', 'object'] %}\n"
    "{{- p.type }}\n"
    "{%- elif p.type is defined and p.type == 'array' %}\n"
    "{{- 'any[]' }}\n"
    "{%- else %}\n"
    "{{- 'any' }}\n"
    "{%- endif %}\n"
    "{{- ',\\n' }}\n"
    "{%- endfor %}\n"
    "{{- '}) => any;\\n' }}\n"
    "{%- else %}\n"
    "{{- 'type ' + f.name + ' = () => any;\\n' }}\n"
    "{%- endif %}\n"
    "{%- endfor %}\n"
    "{{- '\\n} // namespace functions' }}\n"
    "{%- endif %}\n"
    "{{- '<|end|>' }}\n"
    "{%- endif %}\n"
    "{%- for m in messages %}\n"
    "{%- set content = m.content if m.content is string else '' %}\n"
    "{%- if m.role == 'user' %}\n"
    "{{- '<|start|>user<|message|>' + content + '<|end|>' }}\n"
    "{%- elif m.role == 'assistant' %}\n"
    "{%- set thought = m.reasoning_content if m.reasoning_content is string else "
    "(m.thinking if m.thinking is string else '') %}\n"
    "{%- if thought and loop.index0 > ns.last_user %}\n"
    "{{- '<|start|>assistant<|channel|>analysis<|message|>' + thought + '<|end|>' }}\n"
    "{%- endif %}\n"
    "{%- if m.tool_calls %}\n"
    "{%- if content %}\n"
    "{{- '<|start|>assistant<|channel|>commentary<|message|>' + content + '<|end|>' }}\n"
    "{%- endif %}\n"
    "{%- for call in m.tool_calls %}\n"
    "{%- set f = call.function if call.function is defined else call %}\n"
    "{{- '<|start|>assistant<|channel|>commentary to=functions.' + f.name + "
    "' <|constrain|>json<|message|>' }}\n"
    "{{- f.arguments if f.arguments is string else f.arguments | tojson }}\n"
    "{{- '<|call|>' }}\n"
    "{%- endfor %}\n"
    "{%- set ns.calls = m.tool_calls %}\n"
    "{%- set ns.k = 0 %}\n"
    "{%- else %}\n"
    "{{- '<|start|>assistant<|channel|>final<|message|>' + content + '<|end|>' }}\n"
    "{%- endif %}\n"
    "{%- elif m.role == 'tool' %}\n"
    "{%- set ns.name = m.name if m.name is string else '' %}\n"
    "{%- for call in ns.calls %}\n"
    "{%- if not ns.name and m.tool_call_id is defined and call.id is defined and "
    "call.id == m.tool_call_id %}\n"
    "{%- set ns.name = (call.function if call.function is defined else call).name %}\n"
    "{%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if not ns.name and ns.k < ns.calls | length %}\n"
    "{%- set call = ns.calls[ns.k] %}\n"
    "{%- set ns.name = (call.function if call.function is defined else call).name %}\n"
    "{%- endif %}\n"
    "{%- set ns.k = ns.k + 1 %}\n"
    "{{- '<|start|>functions.' + (ns.name if ns.name else 'unknown') + "
    "' to=assistant<|channel|>commentary<|message|>' + content + '<|end|>' }}\n"
    "{%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "{{- '<|start|>assistant' }}\n"
    "{%- endif %}\n";

/* Special tokens of the built-in vocabularies, in id order after the BPE tokens.
 * The tags a reply carries (think, tool call, arguments) are user-defined, so that
 * they stay in the detokenized text the server splits into reasoning and calls;
 * the turn and prompt markers are control tokens. */
typedef struct special {
    const char *text;
    int32_t type;
} special_t;

static const special_t qwen_specials[] = {
    {"<|endoftext|>", MK_TOK_CONTROL},
    {"<|im_start|>", MK_TOK_CONTROL},
    {"<|im_end|>", MK_TOK_CONTROL},
    {"<think>", MK_TOK_USER_DEFINED},
    {"</think>", MK_TOK_USER_DEFINED},
};

static const special_t glm_specials[] = {
    {"<|endoftext|>", MK_TOK_CONTROL},
    {"[gMASK]", MK_TOK_CONTROL},
    {"<sop>", MK_TOK_CONTROL},
    {"<|system|>", MK_TOK_CONTROL},
    {"<|user|>", MK_TOK_CONTROL},
    {"<|assistant|>", MK_TOK_CONTROL},
    {"<|observation|>", MK_TOK_CONTROL},
    {"<think>", MK_TOK_USER_DEFINED},
    {"</think>", MK_TOK_USER_DEFINED},
    {"<tool_call>", MK_TOK_USER_DEFINED},
    {"</tool_call>", MK_TOK_USER_DEFINED},
    {"<arg_key>", MK_TOK_USER_DEFINED},
    {"</arg_key>", MK_TOK_USER_DEFINED},
    {"<arg_value>", MK_TOK_USER_DEFINED},
    {"</arg_value>", MK_TOK_USER_DEFINED},
    {"<tool_response>", MK_TOK_USER_DEFINED},
    {"</tool_response>", MK_TOK_USER_DEFINED},
};

static const special_t deepseek_specials[] = {
    {DS_BOS, MK_TOK_CONTROL},
    {DS_EOS, MK_TOK_CONTROL},
    {DS_USER, MK_TOK_CONTROL},
    {DS_ASSISTANT, MK_TOK_CONTROL},
    {"<think>", MK_TOK_USER_DEFINED},
    {"</think>", MK_TOK_USER_DEFINED},
    {DS_CALLS_BEGIN, MK_TOK_USER_DEFINED},
    {DS_CALLS_END, MK_TOK_USER_DEFINED},
    {DS_CALL_BEGIN, MK_TOK_USER_DEFINED},
    {DS_CALL_END, MK_TOK_USER_DEFINED},
    {DS_SEP, MK_TOK_USER_DEFINED},
    {DS_OUTPUTS_BEGIN, MK_TOK_CONTROL},
    {DS_OUTPUTS_END, MK_TOK_CONTROL},
    {DS_OUTPUT_BEGIN, MK_TOK_CONTROL},
    {DS_OUTPUT_END, MK_TOK_CONTROL},
};

static const special_t harmony_specials[] = {
    {"<|startoftext|>", MK_TOK_CONTROL},
    {"<|endoftext|>", MK_TOK_CONTROL},
    {"<|return|>", MK_TOK_CONTROL},
    {"<|constrain|>", MK_TOK_CONTROL},
    {"<|channel|>", MK_TOK_CONTROL},
    {"<|start|>", MK_TOK_CONTROL},
    {"<|end|>", MK_TOK_CONTROL},
    {"<|message|>", MK_TOK_CONTROL},
    {"<|call|>", MK_TOK_CONTROL},
};

#define COUNT(a) (sizeof (a) / sizeof (a)[0])
_Static_assert(256 + COUNT(qwen_specials) == MK_VOCAB_BUILTIN_MIN, "qwen minimum");
_Static_assert(256 + COUNT(glm_specials) == MK_VOCAB_BUILTIN_MIN_GLM, "glm minimum");
_Static_assert(256 + COUNT(deepseek_specials) == MK_VOCAB_BUILTIN_MIN_DEEPSEEK, "deepseek minimum");
_Static_assert(256 + COUNT(harmony_specials) == MK_VOCAB_BUILTIN_MIN_HARMONY, "harmony minimum");

/* The pre-tokenizer splits the merges are learned under (see "built-in BPE
 * learner"). */
typedef enum split {
    SPLIT_QWEN2,    /* contractions, single digits, then the words */
    SPLIT_LLAMA3,   /* the same with runs of up to three digits (glm4) */
    SPLIT_DEEPSEEK3, /* digit runs of up to three first, then the words, no contractions */
    SPLIT_O200K     /* words cut where the case changes, contractions on their word,
                     * runs of up to three digits (gpt-4o) */
} split_t;

/* What a family adds to the learned tokens. split: its pre-tokenizer's (qwen2
 * splits digits one by one, glm4 in runs of up to three), so that no merge is
 * learned across a boundary the tokenizer cuts. The ids are indices into specials
 * (-1: none); GLM-4.5 ends a reply with <|endoftext|> or by starting the next turn
 * (eot <|user|>, eom <|observation|>), its bos [gMASK] comes from the template. */
typedef struct family {
    const special_t *specials;
    size_t n_specials;
    const char *chat_template;
    split_t split;
    int bos, eos, pad, eot, eom;
    int add_bos;
} family_t;

static const family_t families[] = {
    /* Qwen3: bos and padding <|endoftext|>, <|im_end|> ends a chat turn */
    [MK_FAMILY_QWEN] = {qwen_specials, COUNT(qwen_specials), qwen_template, SPLIT_QWEN2,
                        .bos = 0, .eos = 2, .pad = 0, .eot = -1, .eom = -1, .add_bos = 0},
    /* Qwen3.5: Qwen3's tokens, its own tool form */
    [MK_FAMILY_QWEN35] = {qwen_specials, COUNT(qwen_specials), qwen35_template, SPLIT_QWEN2,
                          .bos = 0, .eos = 2, .pad = 0, .eot = -1, .eom = -1, .add_bos = 0},
    [MK_FAMILY_GLM] = {glm_specials, COUNT(glm_specials), glm_template, SPLIT_LLAMA3,
                       .bos = 1, .eos = 0, .pad = 0, .eot = 4, .eom = 6, .add_bos = 0},
    /* DeepSeek-V3: BOS added to every prompt, <｜end▁of▁sentence｜> ends a reply and pads */
    [MK_FAMILY_DEEPSEEK] = {deepseek_specials, COUNT(deepseek_specials), deepseek_template,
                            SPLIT_DEEPSEEK3, .bos = 0, .eos = 1, .pad = 1, .eot = -1, .eom = -1,
                            .add_bos = 1},
    /* gpt-oss: a reply ends at <|return|> (eos) or <|call|> (eom); <|end|> only
     * closes a message (the analysis one comes before the final one), so no eot;
     * <|startoftext|> is bos but never added, <|endoftext|> pads */
    [MK_FAMILY_HARMONY] = {harmony_specials, COUNT(harmony_specials), harmony_template,
                           SPLIT_O200K, .bos = 0, .eos = 2, .pad = 1, .eot = -1, .eom = 8,
                           .add_bos = 0},
};

size_t mk_vocab_builtin_min(mk_family_t family)
{
    return 256 + families[family].n_specials;
}

void mk_vocab_free(mk_vocab_t *v)
{
    if (!v)
        return;
    for (size_t i = 0; i < v->n; i++)
        free(v->tokens[i]);
    free(v->tokens);
    free(v->types);
    for (size_t i = 0; i < v->n_merges; i++)
        free(v->merges[i]);
    free(v->merges);
    free(v->chat_template);
    memset(v, 0, sizeof *v);
}

static void vocab_init(mk_vocab_t *v)
{
    memset(v, 0, sizeof *v);
    v->bos_id = v->eos_id = v->pad_id = v->eot_id = v->eom_id = -1;
}

/* Sets the token array to n entries, the new ones NULL with type 0. */
static int vocab_resize(mk_vocab_t *v, size_t n)
{
    if (n > SIZE_MAX / sizeof(char *))
        return BL_ENOMEM;
    char **t = realloc(v->tokens, (n ? n : 1) * sizeof *t);
    if (!t)
        return BL_ENOMEM;
    v->tokens = t;
    int32_t *ty = realloc(v->types, (n ? n : 1) * sizeof *ty);
    if (!ty)
        return BL_ENOMEM;
    v->types = ty;
    for (size_t i = v->n; i < n; i++) {
        v->tokens[i] = NULL;
        v->types[i] = 0;
    }
    v->n = n;
    return 0;
}

/* Fills every empty slot with an unused "[PADi]" token, as converted Qwen
 * models do for the embedding rows past the tokenizer's last id. */
static int fill_pads(mk_vocab_t *v)
{
    for (size_t i = 0; i < v->n; i++) {
        if (v->tokens[i])
            continue;
        char buf[32];
        snprintf(buf, sizeof buf, "[PAD%zu]", i);
        v->tokens[i] = strdup(buf);
        if (!v->tokens[i])
            return BL_ENOMEM;
        v->types[i] = MK_TOK_UNUSED;
    }
    return 0;
}

static int64_t find_token(const mk_vocab_t *v, const char *text)
{
    /* Added (special) tokens sit at the end, so search from there. */
    for (size_t i = v->n; i-- > 0;)
        if (v->tokens[i] && strcmp(v->tokens[i], text) == 0)
            return (int64_t)i;
    return -1;
}

void mk_vocab_harmony_ids(mk_vocab_t *v)
{
    int64_t id;
    if ((id = find_token(v, "<|call|>")) >= 0)
        v->eom_id = id;
}

void mk_vocab_glm_ids(mk_vocab_t *v)
{
    int64_t id;
    if ((id = find_token(v, "[gMASK]")) >= 0)
        v->bos_id = id;
    if ((id = find_token(v, "<|user|>")) >= 0)
        v->eot_id = id;
    if ((id = find_token(v, "<|observation|>")) >= 0)
        v->eom_id = id;
}

int mk_vocab_pad(mk_vocab_t *v, size_t n, bl_err_t *err)
{
    if (n < v->n)
        return bl_err_set(err, BL_EINVAL, "vocabulary of %zu tokens cannot shrink to %zu", v->n, n);
    if (vocab_resize(v, n) || fill_pads(v))
        return bl_err_set(err, BL_ENOMEM, "out of memory padding the vocabulary to %zu", n);
    return 0;
}

/* --- GPT-2 byte-level alphabet ------------------------------------------------------
 * Byte-level BPE spells every byte as a printable code point: the bytes that are
 * already printable Latin-1 keep their value, the other 68 (controls, space, DEL,
 * NBSP, soft hyphen) move to U+0100 onwards in byte order. Token ids 0..255 list
 * the bytes in that same order: printable ones first, then the moved ones. */

static int byte_is_printable(int b)
{
    return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
}

/* cp[b]: the code point byte b is spelled with; order[i]: the byte of token id i. */
static void byte_alphabet(uint32_t cp[256], uint8_t order[256])
{
    int n = 0, moved = 0;
    for (int b = 0; b < 256; b++)
        if (byte_is_printable(b)) {
            cp[b] = (uint32_t)b;
            order[n++] = (uint8_t)b;
        }
    for (int b = 0; b < 256; b++)
        if (!byte_is_printable(b)) {
            cp[b] = 256u + (uint32_t)moved++;
            order[n++] = (uint8_t)b;
        }
}

/* UTF-8 of a code point below U+0800 (all the alphabet needs); returns the length. */
static int utf8_put(char *out, uint32_t c)
{
    if (c < 0x80) {
        out[0] = (char)c;
        return 1;
    }
    out[0] = (char)(0xC0 | (c >> 6));
    out[1] = (char)(0x80 | (c & 0x3F));
    return 2;
}

/* --- built-in BPE learner -------------------------------------------------------------
 * The text is split into pre-tokens the way Qwen2's pre-tokenizer splits ASCII
 * (contractions, optional leading non-letter + letters, single digits, optional
 * space + punctuation run, newline runs, other whitespace), since merges across
 * those boundaries could never apply; GLM-4.5's (Llama 3's) differs only in
 * keeping runs of up to three digits together. DeepSeek-V3's cuts the digit runs
 * (up to three digits a piece) out first and splits the text between them as its
 * own string, without contractions (router/tokenizer_bpe.c has its regexes; the
 * CJK split between the two finds nothing in ASCII text). gpt-oss's (gpt-4o,
 * tiktoken's o200k) cuts words where the case changes and keeps a contraction on
 * the word before it (pretoken_o200k_len). Then, repeatedly, the most frequent adjacent
 * symbol pair over all pre-tokens becomes a merge (ties go to the pair whose
 * texts sort first), until the vocabulary is full or nothing is left to merge. */

static int is_alpha(int c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
static int is_digit(int c) { return c >= '0' && c <= '9'; }
static int is_space(int c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
static int is_nl(int c) { return c == '\n' || c == '\r'; }
static int is_punct(int c) { return c && !is_space(c) && !is_alpha(c) && !is_digit(c); }

/* A whitespace run at s: up to its last newline if it has one; otherwise all of it
 * but the last space when a word follows, which that word then takes (every split's
 * rule for white space). */
static size_t ws_run_len(const char *s)
{
    size_t end = 0, last_nl = 0;
    while (is_space((unsigned char)s[end])) {
        if (is_nl((unsigned char)s[end]))
            last_nl = end + 1;
        end++;
    }
    if (last_nl)
        return last_nl;
    if (s[end] && end > 1)
        return end - 1;
    return end;
}

/* Length of the pre-token starting at s (s non-empty, ASCII); a digit run is cut
 * every max_digits digits. */
static size_t pretoken_len(const char *s, int max_digits)
{
    size_t i = 0;
    int c = (unsigned char)s[0];
    if (c == '\'') {
        static const char *const tails[] = {"re", "ve", "ll", "s", "t", "m", "d"};
        for (size_t k = 0; k < sizeof tails / sizeof tails[0]; k++) {
            size_t n = strlen(tails[k]);
            if (strncasecmp(s + 1, tails[k], n) == 0)
                return 1 + n;
        }
    }
    if (is_alpha(c) || (!is_nl(c) && !is_alpha(c) && !is_digit(c) && is_alpha((unsigned char)s[1]))) {
        i = is_alpha(c) ? 0 : 1;
        while (is_alpha((unsigned char)s[i]))
            i++;
        return i;
    }
    if (is_digit(c)) {
        while (i < (size_t)max_digits && is_digit((unsigned char)s[i]))
            i++;
        return i;
    }
    if (is_punct(c) || (c == ' ' && is_punct((unsigned char)s[1]))) {
        i = c == ' ' ? 1 : 0;
        while (is_punct((unsigned char)s[i]))
            i++;
        while (is_nl((unsigned char)s[i]))
            i++;
        return i;
    }
    return ws_run_len(s);
}

/* DeepSeek-V3's word split of ASCII text, within the n bytes (n >= 1, no digit)
 * between two digit runs: a punctuation mark with the letters after it; an
 * optional space, tab or control character with the letters after it; an optional
 * space with a punctuation run and the newlines after it; then white space as
 * Qwen2's, where the end of the n bytes counts as the end of the text. */
static size_t pretoken_ds3_len(const char *s, size_t n)
{
    const int c = (unsigned char)s[0], c1 = n > 1 ? (unsigned char)s[1] : 0;
    size_t i;
    if (is_alpha(c) || (!is_nl(c) && is_alpha(c1))) {
        for (i = 1; i < n && is_alpha((unsigned char)s[i]);)
            i++;
        return i;
    }
    if (is_punct(c) || (c == ' ' && is_punct(c1))) {
        for (i = c == ' ' ? 1 : 0; i < n && is_punct((unsigned char)s[i]);)
            i++;
        while (i < n && is_nl((unsigned char)s[i]))
            i++;
        return i;
    }
    size_t end = 0, last_nl = 0;
    while (end < n && is_space((unsigned char)s[end])) {
        if (is_nl((unsigned char)s[end]))
            last_nl = end + 1;
        end++;
    }
    if (last_nl)
        return last_nl;
    if (end < n && end > 1)
        return end - 1;
    return end ? end : 1;
}

static int is_upper(int c) { return c >= 'A' && c <= 'Z'; }
static int is_lower(int c) { return c >= 'a' && c <= 'z'; }

/* The length of the contraction ('s 't 're 've 'm 'll 'd, any case) at s, or 0. */
static size_t contraction_len(const char *s)
{
    static const char *const tails[] = {"s", "t", "re", "ve", "m", "ll", "d"};
    if (s[0] != '\'')
        return 0;
    for (size_t k = 0; k < sizeof tails / sizeof tails[0]; k++) {
        size_t n = strlen(tails[k]);
        if (strncasecmp(s + 1, tails[k], n) == 0)
            return 1 + n;
    }
    return 0;
}

/* gpt-oss's split (pre "gpt-4o") of ASCII text: tiktoken's o200k_base pattern, as
 * gpt-oss's tokenizer.json and llama.cpp's LLAMA_VOCAB_PRE_TYPE_GPT4O give it (the
 * latter rewritten for its regex engine; on ASCII the two agree), U and L for
 * [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}] and [\p{Ll}\p{Lm}\p{Lo}\p{M}], C for
 * (?i:'s|'t|'re|'ve|'m|'ll|'d):
 *   [^\r\n\p{L}\p{N}]?U*L+C?|[^\r\n\p{L}\p{N}]?U+L*C?|\p{N}{1,3}|
 *    ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+
 * In ASCII: one optional character that is no letter, digit, CR or LF, then a run
 * of upper-case letters and a run of lower-case ones (together not empty:
 * "HelloWorld" is "Hello" "World", "HTTPServer" one word, "iPhone" "i" "Phone"),
 * then a contraction; else up to three digits; else an optional space, a
 * punctuation run and the CRs, LFs and slashes after it; else white space as
 * Qwen2's. */
static size_t pretoken_o200k_len(const char *s)
{
    const int c = (unsigned char)s[0];
    size_t i = !is_alpha(c) && !is_digit(c) && !is_nl(c) ? 1 : 0;
    size_t end = i;
    while (is_upper((unsigned char)s[end]))
        end++;
    while (is_lower((unsigned char)s[end]))
        end++;
    if (end > i) /* letters after the optional character */
        return end + contraction_len(s + end);
    if (is_digit(c)) {
        for (i = 1; i < 3 && is_digit((unsigned char)s[i]);)
            i++;
        return i;
    }
    if (is_punct(c) || (c == ' ' && is_punct((unsigned char)s[1]))) {
        i = c == ' ' ? 1 : 0;
        while (is_punct((unsigned char)s[i]))
            i++;
        while (is_nl((unsigned char)s[i]) || s[i] == '/')
            i++;
        return i;
    }
    return ws_run_len(s);
}

/* Length of the pre-token starting at s (s non-empty, ASCII) under split. */
static size_t split_len(const char *s, split_t split)
{
    if (split == SPLIT_O200K)
        return pretoken_o200k_len(s);
    if (split != SPLIT_DEEPSEEK3)
        return pretoken_len(s, split == SPLIT_QWEN2 ? 1 : 3);
    size_t n = 0;
    if (is_digit((unsigned char)s[0])) {
        while (n < 3 && is_digit((unsigned char)s[n]))
            n++;
        return n;
    }
    while (s[n] && !is_digit((unsigned char)s[n]))
        n++;
    return pretoken_ds3_len(s, n);
}

typedef struct learner {
    char **sym;          /* symbol texts (byte-level UTF-8); the first 256 are bytes */
    size_t n_sym, sym_cap;
    int32_t *seq;        /* all pre-tokens' symbols, back to back */
    size_t *word_start;  /* (n_words + 1) offsets into seq */
    size_t *word_len;    /* current symbol count of each word */
    int64_t *word_freq;
    size_t n_words;
} learner_t;

static void learner_free(learner_t *L)
{
    for (size_t i = 0; i < L->n_sym; i++)
        free(L->sym[i]);
    free(L->sym);
    free(L->seq);
    free(L->word_start);
    free(L->word_len);
    free(L->word_freq);
}

static int sym_add(learner_t *L, char *text)
{
    if (L->n_sym == L->sym_cap) {
        size_t cap = L->sym_cap ? L->sym_cap * 2 : 512;
        char **s = realloc(L->sym, cap * sizeof *s);
        if (!s)
            return BL_ENOMEM;
        L->sym = s;
        L->sym_cap = cap;
    }
    L->sym[L->n_sym++] = text;
    return 0;
}

static int cmp_cstr(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Splits the text into pre-tokens, merges repeats (counting them) and spells each
 * as byte symbols. */
static int learner_init(learner_t *L, const uint32_t cp[256], const uint8_t order[256],
                        split_t split)
{
    memset(L, 0, sizeof *L);
    size_t len = strlen(builtin_text), n = 0;
    char **words = malloc((len + 1) * sizeof *words);
    int rc = BL_ENOMEM;
    if (!words)
        return BL_ENOMEM;
    for (size_t i = 0; i < len;) {
        size_t k = split_len(builtin_text + i, split);
        words[n] = strndup(builtin_text + i, k);
        if (!words[n])
            goto fail;
        n++;
        i += k;
    }
    qsort(words, n, sizeof *words, cmp_cstr);

    L->word_start = malloc((n + 1) * sizeof *L->word_start);
    L->word_len = malloc((n + 1) * sizeof *L->word_len);
    L->word_freq = malloc((n + 1) * sizeof *L->word_freq);
    L->seq = malloc((len + 1) * sizeof *L->seq);
    if (!L->word_start || !L->word_len || !L->word_freq || !L->seq)
        goto fail;
    size_t pos = 0;
    for (size_t i = 0; i < n;) {
        size_t j = i;
        while (j < n && strcmp(words[j], words[i]) == 0)
            j++;
        size_t w = L->n_words++;
        L->word_start[w] = pos;
        L->word_freq[w] = (int64_t)(j - i);
        for (const unsigned char *p = (const unsigned char *)words[i]; *p; p++)
            L->seq[pos++] = *p; /* byte b is symbol b until the table is built below */
        L->word_len[w] = pos - L->word_start[w];
        i = j;
    }
    L->word_start[L->n_words] = pos;

    /* Symbols 0..255 in token-id order; seq holds bytes, so remap them. */
    int32_t sym_of_byte[256];
    for (int id = 0; id < 256; id++) {
        char buf[4];
        int k = utf8_put(buf, cp[order[id]]);
        char *t = strndup(buf, (size_t)k);
        if (!t || sym_add(L, t)) {
            free(t);
            goto fail;
        }
        sym_of_byte[order[id]] = id;
    }
    for (size_t i = 0; i < pos; i++)
        L->seq[i] = sym_of_byte[L->seq[i]];
    rc = 0;
fail:
    for (size_t i = 0; i < n; i++)
        free(words[i]);
    free(words);
    return rc;
}

/* Open-addressing table of pair counts, rebuilt for each merge. */
typedef struct pair_slot {
    uint64_t key; /* (left << 32 | right) + 1; 0 marks an empty slot */
    int64_t count;
} pair_slot_t;

/* Finds the best pair; returns 0 and sets *a, *b, or 1 when no pair is left. */
static int best_pair(const learner_t *L, pair_slot_t *tab, size_t mask, int32_t *a, int32_t *b)
{
    memset(tab, 0, (mask + 1) * sizeof *tab);
    for (size_t w = 0; w < L->n_words; w++) {
        const int32_t *s = L->seq + L->word_start[w];
        for (size_t i = 0; i + 1 < L->word_len[w]; i++) {
            uint64_t key = ((uint64_t)(uint32_t)s[i] << 32 | (uint32_t)s[i + 1]) + 1;
            size_t h = (size_t)((key * 0x9E3779B97F4A7C15ull) >> 20) & mask;
            while (tab[h].key && tab[h].key != key)
                h = (h + 1) & mask;
            tab[h].key = key;
            tab[h].count += L->word_freq[w];
        }
    }
    int found = 0;
    int64_t best = 0;
    for (size_t h = 0; h <= mask; h++) {
        if (!tab[h].key)
            continue;
        int32_t l = (int32_t)((tab[h].key - 1) >> 32), r = (int32_t)((tab[h].key - 1) & 0xFFFFFFFFu);
        int better = !found || tab[h].count > best;
        if (found && tab[h].count == best) {
            int c = strcmp(L->sym[l], L->sym[*a]);
            better = c < 0 || (c == 0 && strcmp(L->sym[r], L->sym[*b]) < 0);
        }
        if (better) {
            found = 1;
            best = tab[h].count;
            *a = l;
            *b = r;
        }
    }
    return found ? 0 : 1;
}

/* Replaces every a,b in every word with c, left to right. */
static void apply_merge(learner_t *L, int32_t a, int32_t b, int32_t c)
{
    for (size_t w = 0; w < L->n_words; w++) {
        int32_t *s = L->seq + L->word_start[w];
        size_t n = L->word_len[w], o = 0;
        for (size_t i = 0; i < n; i++) {
            if (i + 1 < n && s[i] == a && s[i + 1] == b) {
                s[o++] = c;
                i++;
            } else {
                s[o++] = s[i];
            }
        }
        L->word_len[w] = o;
    }
}

int mk_vocab_builtin(mk_vocab_t *v, size_t n_vocab, mk_family_t family, bl_err_t *err)
{
    vocab_init(v);
    if ((unsigned)family >= COUNT(families))
        return bl_err_set(err, BL_EINVAL, "built-in vocabulary: no family %d", (int)family);
    const family_t *fam = &families[family];
    if (n_vocab < mk_vocab_builtin_min(family))
        return bl_err_set(err, BL_EINVAL, "built-in vocabulary needs at least %zu tokens, not %zu",
                          mk_vocab_builtin_min(family), n_vocab);
    learner_t L;
    uint32_t cp[256];
    uint8_t order[256];
    pair_slot_t *tab = NULL;
    size_t merges_cap = 0;
    int rc;
    byte_alphabet(cp, order);
    if ((rc = learner_init(&L, cp, order, fam->split)))
        goto fail;
    size_t mask = 1;
    while (mask < 2 * L.word_start[L.n_words] + 16)
        mask <<= 1;
    tab = malloc(mask * sizeof *tab);
    mask -= 1;
    if (!tab) {
        rc = BL_ENOMEM;
        goto fail;
    }

    size_t n_bpe = n_vocab - fam->n_specials;
    while (L.n_sym < n_bpe) {
        int32_t a = 0, b = 0;
        if (best_pair(&L, tab, mask, &a, &b))
            break; /* every pre-token is one symbol: the text has nothing left to teach */
        size_t la = strlen(L.sym[a]), lb = strlen(L.sym[b]);
        char *m = malloc(la + lb + 2), *t = malloc(la + lb + 1);
        if (!m || !t) {
            free(m);
            free(t);
            rc = BL_ENOMEM;
            goto fail;
        }
        memcpy(m, L.sym[a], la);
        m[la] = ' ';
        memcpy(m + la + 1, L.sym[b], lb + 1);
        memcpy(t, L.sym[a], la);
        memcpy(t + la, L.sym[b], lb + 1);
        if (v->n_merges == merges_cap) {
            merges_cap = merges_cap ? merges_cap * 2 : 1024;
            char **mm = realloc(v->merges, merges_cap * sizeof *mm);
            if (!mm) {
                free(m);
                free(t);
                rc = BL_ENOMEM;
                goto fail;
            }
            v->merges = mm;
        }
        v->merges[v->n_merges++] = m;
        /* Two different pairs can spell the same text ("ab"+"c", "a"+"bc"): the
         * merge is kept, the token is not added twice. */
        int32_t c = -1;
        for (size_t i = 256; i < L.n_sym; i++)
            if (strcmp(L.sym[i], t) == 0) {
                c = (int32_t)i;
                break;
            }
        if (c >= 0) {
            free(t);
        } else {
            if ((rc = sym_add(&L, t))) {
                free(t);
                goto fail;
            }
            c = (int32_t)L.n_sym - 1;
        }
        apply_merge(&L, a, b, c);
    }

    /* Tokens: the learned symbols, the specials, then padding up to n_vocab. */
    if ((rc = vocab_resize(v, n_vocab)))
        goto fail;
    for (size_t i = 0; i < L.n_sym; i++) {
        v->tokens[i] = L.sym[i];
        v->types[i] = MK_TOK_NORMAL;
        L.sym[i] = NULL;
    }
    size_t first_special = L.n_sym;
    for (size_t k = 0; k < fam->n_specials; k++) {
        v->tokens[first_special + k] = strdup(fam->specials[k].text);
        if (!v->tokens[first_special + k]) {
            rc = BL_ENOMEM;
            goto fail;
        }
        v->types[first_special + k] = fam->specials[k].type;
    }
    if ((rc = fill_pads(v)))
        goto fail;
    const int ids[] = {fam->bos, fam->eos, fam->pad, fam->eot, fam->eom};
    int64_t *dst[] = {&v->bos_id, &v->eos_id, &v->pad_id, &v->eot_id, &v->eom_id};
    for (size_t k = 0; k < COUNT(ids); k++)
        *dst[k] = ids[k] < 0 ? -1 : (int64_t)(first_special + (size_t)ids[k]);
    v->add_bos = fam->add_bos;
    v->chat_template = strdup(fam->chat_template);
    if (!v->chat_template) {
        rc = BL_ENOMEM;
        goto fail;
    }
    free(tab);
    learner_free(&L);
    return 0;
fail:
    free(tab);
    learner_free(&L);
    mk_vocab_free(v);
    return bl_err_set(err, rc, "built-in vocabulary: %s", bl_strerror(rc));
}

/* --- Hugging Face tokenizer folders --------------------------------------------------- */

/* A token given in tokenizer_config.json either as a string or as an object with
 * a "content" string (older files). Returns NULL for null/absent. */
static const char *token_text(json_t *j)
{
    if (json_is_string(j))
        return json_string_value(j);
    if (json_is_object(j) && json_is_string(json_object_get(j, "content")))
        return json_string_value(json_object_get(j, "content"));
    return NULL;
}

/* Resolves a tokenizer_config.json token field to an id: -1 when the field is
 * absent or null, an error when it names no token. */
static int config_token(const mk_vocab_t *v, json_t *cfg, const char *field, const char *path,
                        int64_t *out, bl_err_t *err)
{
    json_t *j = json_object_get(cfg, field);
    *out = -1;
    if (!j || json_is_null(j))
        return 0;
    const char *text = token_text(j);
    if (!text)
        return bl_err_set(err, BL_EINVAL, "%s: %s is neither a string nor a token object", path,
                          field);
    *out = find_token(v, text);
    if (*out < 0)
        return bl_err_set(err, BL_EINVAL, "%s: %s '%s' is not a token of the vocabulary", path,
                          field, text);
    return 0;
}

/* jansson reports line -1 when the file could not be opened at all. */
static int json_load_error(const char *path, const json_error_t *je, bl_err_t *err)
{
    if (je->line < 1)
        return bl_err_set(err, BL_EINVAL, "%s: %s", path, je->text);
    return bl_err_set(err, BL_EINVAL, "%s: line %d column %d: %s", path, je->line, je->column,
                      je->text);
}

#define MAX_TOKEN_ID (1 << 24) /* far above any real vocabulary; bounds the allocation */

static int load_tokenizer_json(mk_vocab_t *v, const char *path, bl_err_t *err)
{
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    int rc = 0;
    if (!root)
        return json_load_error(path, &je, err);
    json_t *model = json_object_get(root, "model");
    if (!json_is_object(model)) {
        rc = bl_err_set(err, BL_EINVAL, "%s: no \"model\" object", path);
        goto done;
    }
    json_t *mtype = json_object_get(model, "type");
    if (mtype && !(json_is_string(mtype) && strcmp(json_string_value(mtype), "BPE") == 0)) {
        rc = bl_err_set(err, BL_EINVAL, "%s: model.type is %s%s%s, only BPE is handled", path,
                        json_is_string(mtype) ? "'" : "",
                        json_is_string(mtype) ? json_string_value(mtype) : "not a string",
                        json_is_string(mtype) ? "'" : "");
        goto done;
    }
    json_t *vocab = json_object_get(model, "vocab");
    json_t *added = json_object_get(root, "added_tokens");
    json_t *merges = json_object_get(model, "merges");
    if (!json_is_object(vocab)) {
        rc = bl_err_set(err, BL_EINVAL, "%s: model.vocab is missing or not an object", path);
        goto done;
    }
    if (added && !json_is_array(added)) {
        rc = bl_err_set(err, BL_EINVAL, "%s: added_tokens is not an array", path);
        goto done;
    }
    if (!json_is_array(merges)) {
        rc = bl_err_set(err, BL_EINVAL, "%s: model.merges is missing or not an array", path);
        goto done;
    }

    /* Size: the largest id named by the vocabulary or the added tokens. */
    const char *key;
    json_t *val;
    json_int_t max_id = -1;
    json_object_foreach(vocab, key, val) {
        json_int_t id = json_is_integer(val) ? json_integer_value(val) : -1;
        if (id < 0 || id >= MAX_TOKEN_ID) {
            rc = bl_err_set(err, BL_EINVAL, "%s: model.vocab['%s'] is not an id in 0..%d", path,
                            key, MAX_TOKEN_ID - 1);
            goto done;
        }
        if (id > max_id)
            max_id = id;
    }
    size_t n_added = added ? json_array_size(added) : 0;
    for (size_t i = 0; i < n_added; i++) {
        json_t *a = json_array_get(added, i);
        json_t *jid = json_object_get(a, "id");
        json_t *content = json_object_get(a, "content");
        json_t *special = json_object_get(a, "special");
        json_int_t id = json_is_integer(jid) ? json_integer_value(jid) : -1;
        if (!json_is_object(a) || id < 0 || id >= MAX_TOKEN_ID || !json_is_string(content) ||
            (special && !json_is_boolean(special))) {
            rc = bl_err_set(err, BL_EINVAL,
                            "%s: added_tokens[%zu] needs an id in 0..%d, a content string and a "
                            "boolean special", path, i, MAX_TOKEN_ID - 1);
            goto done;
        }
        if (id > max_id)
            max_id = id;
    }
    if (max_id < 0) {
        rc = bl_err_set(err, BL_EINVAL, "%s: model.vocab is empty", path);
        goto done;
    }
    if (vocab_resize(v, (size_t)max_id + 1)) {
        rc = bl_err_set(err, BL_ENOMEM, "%s: out of memory for %lld tokens", path,
                        (long long)max_id + 1);
        goto done;
    }

    json_object_foreach(vocab, key, val) {
        size_t id = (size_t)json_integer_value(val);
        if (v->tokens[id]) {
            rc = bl_err_set(err, BL_EINVAL, "%s: model.vocab: id %zu given to '%s' and '%s'", path,
                            id, v->tokens[id], key);
            goto done;
        }
        if (!(v->tokens[id] = strdup(key))) {
            rc = bl_err_set(err, BL_ENOMEM, "%s: out of memory", path);
            goto done;
        }
        v->types[id] = MK_TOK_NORMAL;
    }
    for (size_t i = 0; i < n_added; i++) {
        json_t *a = json_array_get(added, i);
        size_t id = (size_t)json_integer_value(json_object_get(a, "id"));
        const char *content = json_string_value(json_object_get(a, "content"));
        if (v->tokens[id] && strcmp(v->tokens[id], content) != 0) {
            rc = bl_err_set(err, BL_EINVAL, "%s: added_tokens[%zu]: id %zu is already '%s', not '%s'",
                            path, i, id, v->tokens[id], content);
            goto done;
        }
        if (!v->tokens[id] && !(v->tokens[id] = strdup(content))) {
            rc = bl_err_set(err, BL_ENOMEM, "%s: out of memory", path);
            goto done;
        }
        v->types[id] = json_is_true(json_object_get(a, "special")) ? MK_TOK_CONTROL
                                                                   : MK_TOK_USER_DEFINED;
    }

    /* Merges: "left right" strings, or [left, right] pairs in newer files. */
    size_t nm = json_array_size(merges);
    v->merges = calloc(nm ? nm : 1, sizeof *v->merges);
    if (!v->merges) {
        rc = bl_err_set(err, BL_ENOMEM, "%s: out of memory for %zu merges", path, nm);
        goto done;
    }
    for (size_t i = 0; i < nm; i++) {
        json_t *m = json_array_get(merges, i);
        char *s = NULL;
        if (json_is_string(m) && strchr(json_string_value(m), ' ')) {
            s = strdup(json_string_value(m));
        } else if (json_is_array(m) && json_array_size(m) == 2 &&
                   json_is_string(json_array_get(m, 0)) && json_is_string(json_array_get(m, 1))) {
            const char *l = json_string_value(json_array_get(m, 0));
            const char *r = json_string_value(json_array_get(m, 1));
            size_t ll = strlen(l), lr = strlen(r);
            if ((s = malloc(ll + lr + 2))) {
                memcpy(s, l, ll);
                s[ll] = ' ';
                memcpy(s + ll + 1, r, lr + 1);
            }
        } else {
            rc = bl_err_set(err, BL_EINVAL,
                            "%s: model.merges[%zu] is neither \"left right\" nor [left, right]",
                            path, i);
            goto done;
        }
        if (!s) {
            rc = bl_err_set(err, BL_ENOMEM, "%s: out of memory", path);
            goto done;
        }
        v->merges[v->n_merges++] = s;
    }
    if (fill_pads(v))
        rc = bl_err_set(err, BL_ENOMEM, "%s: out of memory", path);
done:
    json_decref(root);
    return rc;
}

static int load_config_json(mk_vocab_t *v, const char *path, bl_err_t *err)
{
    json_error_t je;
    json_t *cfg = json_load_file(path, 0, &je);
    int rc = 0;
    if (!cfg)
        return json_load_error(path, &je, err);
    if (!json_is_object(cfg)) {
        rc = bl_err_set(err, BL_EINVAL, "%s: not a JSON object", path);
        goto done;
    }
    if ((rc = config_token(v, cfg, "eos_token", path, &v->eos_id, err)) ||
        (rc = config_token(v, cfg, "pad_token", path, &v->pad_id, err)) ||
        (rc = config_token(v, cfg, "bos_token", path, &v->bos_id, err)))
        goto done;
    /* Qwen3 names no BOS token here, yet its GGUF files carry <|endoftext|> as BOS
     * (from the model's config.json); do the same when that token exists. */
    if (v->bos_id < 0)
        v->bos_id = find_token(v, "<|endoftext|>");

    json_t *ab = json_object_get(cfg, "add_bos_token");
    if (ab && !json_is_null(ab) && !json_is_boolean(ab)) {
        rc = bl_err_set(err, BL_EINVAL, "%s: add_bos_token is not a boolean", path);
        goto done;
    }
    v->add_bos = json_is_true(ab);

    /* chat_template: a string, or a list of {name, template} where "default" wins. */
    json_t *ct = json_object_get(cfg, "chat_template");
    const char *tmpl = NULL;
    if (json_is_string(ct)) {
        tmpl = json_string_value(ct);
    } else if (json_is_array(ct)) {
        for (size_t i = 0; i < json_array_size(ct); i++) {
            json_t *e = json_array_get(ct, i);
            json_t *name = json_object_get(e, "name"), *t = json_object_get(e, "template");
            if (!json_is_string(name) || !json_is_string(t)) {
                rc = bl_err_set(err, BL_EINVAL,
                                "%s: chat_template[%zu] needs name and template strings", path, i);
                goto done;
            }
            if (!tmpl || strcmp(json_string_value(name), "default") == 0)
                tmpl = json_string_value(t);
        }
    } else if (ct && !json_is_null(ct)) {
        rc = bl_err_set(err, BL_EINVAL, "%s: chat_template is neither a string nor a list", path);
        goto done;
    }
    if (tmpl && !(v->chat_template = strdup(tmpl)))
        rc = bl_err_set(err, BL_ENOMEM, "%s: out of memory", path);
done:
    json_decref(cfg);
    return rc;
}

int mk_vocab_load(mk_vocab_t *v, const char *dir, bl_err_t *err)
{
    vocab_init(v);
    size_t n = strlen(dir) + 32;
    char *path = malloc(n);
    int rc;
    if (!path)
        return bl_err_set(err, BL_ENOMEM, "out of memory");
    snprintf(path, n, "%s/tokenizer.json", dir);
    if ((rc = load_tokenizer_json(v, path, err)))
        goto fail;
    snprintf(path, n, "%s/tokenizer_config.json", dir);
    if ((rc = load_config_json(v, path, err)))
        goto fail;
    free(path);
    return 0;
fail:
    free(path);
    mk_vocab_free(v);
    return rc;
}
