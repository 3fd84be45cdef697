#!/usr/bin/env node
// Builds the quickstart's chat fine-tuning set from real public Q&A data installed by Debian packages:
//   bsdgames     usr/share/games/bsdgames/quiz/{index,<subject>}   ~2,400 quiz questions (capitals, elements, ...)
//   fortunes-min usr/share/games/fortunes/riddles                  Q:/A: riddles
// plus generated two-number arithmetic (fixed seed). Writes OUT/train.jsonl and OUT/eval.jsonl, one OpenAI chat
// line each: {"messages":[{"role":"system",...},{"role":"user",...},{"role":"assistant",...}]}.
// Same inputs and options give byte-identical files. Node 20, no npm dependencies.
//
// Usage: node make_chat_data.mjs --out DIR [--quiz-dir DIR] [--riddles FILE] [--arith N] [--seed N]
//                                [--eval-percent P] [--riddle-max-chars N] [--system TEXT] [--verbose]
import fs from 'node:fs';
import path from 'node:path';
import { parseArgs } from 'node:util';

const PROG = 'make_chat_data';
const DEFAULT_QUIZ_DIR = '/usr/share/games/bsdgames/quiz';
const DEFAULT_RIDDLES = '/usr/share/games/fortunes/riddles';
const DEFAULT_SYSTEM = 'You are a helpful assistant. Answer briefly.';

class DataError extends Error {}
const fail = (msg) => { throw new DataError(msg); };

// ---------------------------------------------------------------------------------------------------------------
// quiz(6) patterns. A data or index line is categories separated by unescaped ':'; a category is a pattern with
// 'a|b' alternatives, '{x}' optional (quiz treats it as '[x|]'), '[a|b]' grouping and '\' quoting one character.
// As in quiz's own parser, '{' and '[' both open a group and the closer alone decides: '}' makes it optional
// (seq-hard really has "[Squares|n[**|^]2} base 8"). AST: an alternation is an array of sequences; a sequence is
// an array of items, each a literal string or {optional, alts}.

function parsePattern(src, where) {
  let i = 0;
  function alternation(nested) {
    const alts = [[]];
    let lit = '';
    const flush = () => { if (lit) { alts[alts.length - 1].push(lit); lit = ''; } };
    while (i < src.length) {
      const c = src[i++];
      if (c === '\\') {
        if (i >= src.length) fail(`${where}: '\\' at the end of pattern "${src}"`);
        lit += src[i++];
      } else if (c === '{' || c === '[') {
        flush();
        const group = alternation(true);
        alts[alts.length - 1].push({ optional: group.closer === '}', alts: group.alts });
      } else if (c === '|') {
        flush();
        alts.push([]);
      } else if (c === '}' || c === ']') {
        if (!nested) fail(`${where}: unmatched '${c}' at offset ${i - 1} in pattern "${src}"`);
        flush();
        return { alts, closer: c };
      } else {
        lit += c;
      }
    }
    if (nested) fail(`${where}: unclosed '{' or '[' in pattern "${src}"`);
    flush();
    return { alts, closer: null };
  }
  return alternation(false).alts;
}

// The capitals spell accents by overstriking, mark-backspace-letter first: "Bogot['\ba|a\b'|a]". An
// alternative holding a control character is not clean text.
const isOverstrike = (seq) => seq.some((it) => typeof it === 'string' && /[\x00-\x1f\x7f]/.test(it));

// The text quiz(6) shows as the right answer (its rxp_expand: the first alternative of every group, optional parts
// included), except that overstruck accents are passed over for the first clean alternative ("Bogota"). With
// dropOptional, optional parts are left out instead ("7{(integers)}" -> "7").
function expandPattern(alts, dropOptional = false) {
  const seq = alts.find((a) => !isOverstrike(a)) || alts[0];
  let out = '';
  for (const item of seq) {
    if (typeof item === 'string') out += item;
    else if (!(item.optional && dropOptional)) out += expandPattern(item.alts, dropOptional);
  }
  return out;
}

// A RegExp accepting what quiz(6) accepts for the pattern (case-insensitive, whole string).
function patternRegExp(alts) {
  const esc = (s) => s.replace(/[.*+?^${}()|[\]\\/]/g, '\\$&');
  const alt = (a) => a.map((seq) => seq.map((it) =>
    typeof it === 'string' ? esc(it) : `(?:${alt(it.alts)})${it.optional ? '?' : ''}`).join('')).join('|');
  return new RegExp(`^(?:${alt(alts)})$`, 'i');
}

// Splits a logical line on unescaped ':' (escapes stay in the pieces for parsePattern).
function splitCategories(line) {
  const out = [];
  let cur = '';
  for (let i = 0; i < line.length; i++) {
    const c = line[i];
    if (c === '\\' && i + 1 < line.length) { cur += c + line[++i]; continue; }
    if (c === ':') { out.push(cur); cur = ''; continue; }
    cur += c;
  }
  out.push(cur);
  return out;
}

function readText(file, what) {
  let bytes;
  try {
    bytes = fs.readFileSync(file);
  } catch (e) {
    fail(`${file}: cannot read ${what} (${e.code || e.message})`);
  }
  try {
    return new TextDecoder('utf-8', { fatal: true }).decode(bytes);
  } catch {
    fail(`${file}: not valid UTF-8`);
  }
}

// Physical lines joined where one ends in an unescaped '\' (quiz's continuation); blank lines dropped.
function logicalLines(text) {
  const out = [];
  const phys = text.split('\n');
  for (let n = 0; n < phys.length; n++) {
    const first = n + 1;
    let line = phys[n].replace(/\r$/, '');
    while (/(^|[^\\])(\\\\)*\\$/.test(line) && n + 1 < phys.length) {
      line = line.slice(0, -1) + phys[++n].replace(/\r$/, '');
    }
    if (line.trim() !== '') out.push({ text: line, line: first });
  }
  return out;
}

// ---------------------------------------------------------------------------------------------------------------
// Which quiz questions to ask. Placeholders name categories the way a quiz(6) user does ("capital" matches the
// index title "cap{ital}"), so the index decides which column holds what. Options:
//   each     a placeholder whose top-level alternatives each make their own question ("cub:lion|tiger|bear")
//   drop     placeholders expanded without their optional parts
//   title    title-case the values ("sinchi roca" -> "Sinchi Roca")
//   verbatim answer kept as is (no capital letter, no final '.'): Morse code and ed commands
//   keep     predicate on the expanded values
const QUIZ_TEMPLATES = [
  ...['africa:African', 'america:American', 'asia:Asian', 'europe:European'].flatMap((s) => {
    const [subject, col] = s.split(':');
    return [
      { subject, q: `What is the capital of {${col}}?`, a: '{capital}' },
      { subject, q: `{capital} is the capital of which country?`, a: `{${col}}` },
    ];
  }),
  { subject: 'province', q: 'What is the capital of the Canadian province {province}?', a: '{capital}' },
  { subject: 'state', q: 'What is the capital of the state of {state}?', a: '{capital}' },
  { subject: 'state', q: 'What is the postal abbreviation of {state}?', a: '{abbreviation}', verbatim: true },
  { subject: 'state', q: 'What is the state flower of {state}?', a: '{flower}', keep: (v) => v.flower !== 'gok' },
  { subject: 'midearth', q: 'In Middle-earth, what is the capital of {Middle-Earth}?', a: '{capital}' },
  { subject: 'elements', q: 'Which chemical element has the symbol {symbol}?', a: '{element}' },
  { subject: 'elements', q: 'What is the chemical symbol of {element}?', a: '{symbol}' },
  { subject: 'elements', q: 'What is the atomic number of {element}?', a: '{number}' },
  { subject: 'pres', q: 'Who succeeded {president} as President of the United States?', a: '{successor}' },
  { subject: 'pres', q: 'When was {president} President of the United States?', a: '{term}',
    keep: (v) => /^\d{4}(-\d{4})?$/.test(v.term) },
  { subject: 'sov', q: 'Who succeeded {sovereign} on the English throne?', a: '{successor}' },
  { subject: 'inca', q: 'Who succeeded the Inca ruler {inca}?', a: '{successor}', title: true },
  { subject: 'collectives', q: 'What is a group of {individuals} called?', a: '{collective}', each: 'individuals' },
  { subject: 'babies', q: 'What is a baby {adult} called?', a: '{baby}', each: 'adult' },
  { subject: 'sexes', q: 'What is the female counterpart of {male}?', a: '{female}' },
  { subject: 'sexes', q: 'What is the male counterpart of {female}?', a: '{male}' },
  { subject: 'posneg', q: 'What is the opposite of {positive}?', a: '{negative}' },
  { subject: 'posneg', q: 'What is the opposite of {negative}?', a: '{positive}' },
  { subject: 'chinese', q: 'In the Chinese zodiac, which year follows the year of the {year}?', a: '{next}' },
  { subject: 'latin', q: 'What does the Latin word "{latin}" mean?', a: '{english}' },
  { subject: 'flowers', q: 'In the language of flowers, what does {flower} mean?', a: '{meaning}' },
  { subject: 'morse', q: 'What is {alphabetic} in Morse code?', a: '{morse}', verbatim: true },
  { subject: 'morse', q: 'Which letter is {morse} in Morse code?', a: '{alphabetic}' },
  { subject: 'mult', q: 'What is {multiplication}?', a: '{answer}' },
  { subject: 'arith', q: 'Fill in the missing number: {arithmetic}', a: '{answer}',
    keep: (v) => v.arithmetic.includes('=') },
  { subject: 'seq-easy', q: 'What comes next in the sequence {easy-sequence}?', a: '{next}', drop: ['next'] },
  { subject: 'seq-easy', q: 'What is the sequence {easy-sequence} called?', a: '{name}' },
  { subject: 'seq-hard', q: 'What comes next in the sequence {hard-sequence}?', a: '{next}', drop: ['next'] },
  { subject: 'seq-hard', q: 'What is the sequence {hard-sequence} called?', a: '{name}' },
  { subject: 'locomotive', q: 'What is the name of the {locomotive} locomotive wheel arrangement?', a: '{name}' },
  { subject: 'trek', q: 'Star Trek quiz: {star}?', a: '{trek}' },
  { subject: 'bard', q: 'In Shakespeare\'s {work}, what line follows "{line}"?', a: '{next}' },
  { subject: 'bard', q: 'In Shakespeare\'s {work}, who says "{line}"?', a: '{character}' },
  { subject: 'poetry', q: 'In the poem "{poem}", what line follows "{poem-line}"?', a: '{next}' },
  { subject: 'poetry', q: 'Who wrote the poem "{poem}"?', a: '{author}' },
  { subject: 'ed', q: 'Which ed command does this: {function}?', a: '{ed-command}', verbatim: true },
  { subject: 'ucc', q: 'What does section {section} of the Uniform Commercial Code cover?', a: '{UCC}' },
  { subject: 'areas', q: 'Which state or region has the telephone area code {area-code}?', a: '{state-region}',
    title: true },
  { subject: 'areas', q: 'Which city has the telephone area code {area-code}?', a: '{city}', title: true },
];
// Not used: greek ($...$ transliteration), murders (quiz's cynical jokes), spell (two lines).

const titleCase = (s) => s.replace(/(^|[\s-])([a-z])/g, (m, pre, ch) => pre + ch.toUpperCase());

// Answers end like a sentence: first letter capitalised, final '.' unless there is already an end mark (a verse
// line's trailing ',' ';' or ':' becomes the '.').
function sentence(s) {
  const t = (s.charAt(0).toUpperCase() + s.slice(1)).replace(/\s*[,;:]$/, '');
  return /[.!?]$/.test(t) ? t : `${t}.`;
}

function readQuizIndex(quizDir) {
  const indexFile = path.join(quizDir, 'index');
  const subjects = new Map();
  for (const { text, line } of logicalLines(readText(indexFile, 'the quiz index (Debian package bsdgames)'))) {
    const cats = splitCategories(text);
    const where = `${indexFile}:${line}`;
    if (cats.length < 3) fail(`${where}: expected "path:category:category...", found "${text}"`);
    // The index holds absolute paths; look the file up beside the index so a copied tree works too.
    const name = path.basename(cats[0]);
    const columns = cats.slice(1).map((c) => patternRegExp(parsePattern(c, where)));
    subjects.set(name, { file: path.join(quizDir, name), columns, where });
  }
  return subjects;
}

function columnOf(subject, info, name) {
  const i = info.columns.findIndex((re) => re.test(name));
  if (i < 0) fail(`${info.where}: subject "${subject}" has no category matching "${name}"`);
  return i;
}

function quizExamples(quizDir, counts) {
  const subjects = readQuizIndex(quizDir);
  const rows = new Map(); // subject -> one array of category patterns per data line
  const out = [];
  for (const t of QUIZ_TEMPLATES) {
    const info = subjects.get(t.subject);
    if (!info) continue; // an older or trimmed quiz tree: ask what it has
    if (!rows.has(t.subject)) {
      const parsed = [];
      for (const { text, line } of logicalLines(readText(info.file, `quiz subject "${t.subject}"`))) {
        const where = `${info.file}:${line}`;
        const cats = splitCategories(text);
        // An unescaped ':' inside a category (ucc has "3-201:transfer: right to indorsement") shifts the
        // columns; quiz(6) would ask it with a wrong answer, we leave the line out.
        if (cats.length > info.columns.length) {
          counts['(lines with extra categories)'] = (counts['(lines with extra categories)'] || 0) + 1;
          continue;
        }
        parsed.push(cats.map((c) => parsePattern(c, where)));
      }
      rows.set(t.subject, parsed);
    }
    const names = [...`${t.q}\n${t.a}`.matchAll(/\{([^{}]+)\}/g)].map((m) => m[1]);
    const col = Object.fromEntries(names.map((n) => [n, columnOf(t.subject, info, n)]));
    for (const row of rows.get(t.subject)) {
      const values = {};
      for (const n of names) {
        const ast = row[col[n]];
        values[n] = ast ? expandPattern(ast, (t.drop || []).includes(n)).trim() : '';
        if (t.title) values[n] = titleCase(values[n]);
      }
      // quiz(6) does not ask a question whose question or answer is empty; overstrike left outside a group
      // (no clean alternative to pick) is not text either.
      if (names.some((n) => values[n] === '' || /[\x00-\x1f\x7f]/.test(values[n]))) continue;
      if (t.keep && !t.keep(values)) continue;
      // each: one question per top-level alternative of that category.
      const variants = t.each
        ? row[col[t.each]].map((seq) => expandPattern([seq]).trim()).filter((s) => s !== '')
        : [values[names[0]]];
      for (const v of variants) {
        const vals = t.each ? { ...values, [t.each]: v } : values;
        const fill = (s) => s.replace(/\{([^{}]+)\}/g, (m, n) => vals[n]);
        const a = fill(t.a);
        out.push({ source: 'quiz', user: fill(t.q), assistant: t.verbatim ? a : sentence(a) });
        counts[t.subject] = (counts[t.subject] || 0) + 1;
      }
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------------------------------------
// fortune(6) riddles: cookies separated by '%' lines; a cookie holds "Q:\t..." / "A:\t..." fields (either order),
// continued on the following lines; an indented "-- name" attribution or a blank line ends a field.
function riddleExamples(file, maxChars) {
  const out = [];
  const text = readText(file, 'the riddles file (Debian package fortunes-min)');
  for (const cookie of text.split(/^%\r?$/m)) {
    const fields = [];
    let cur = null;
    for (const raw of cookie.split('\n')) {
      const line = raw.replace(/\r$/, '');
      const m = /^([QA]):\s*(.*)$/.exec(line);
      if (m) {
        cur = { kind: m[1], text: m[2] };
        fields.push(cur);
      } else if (line.trim() === '' || /^\s+--\s/.test(line)) {
        cur = null;
      } else if (cur) {
        cur.text += ` ${line}`;
      }
    }
    for (let i = 0; i + 1 < fields.length; i++) {
      const [f, g] = [fields[i], fields[i + 1]];
      if (f.kind === g.kind) continue;
      const [q, a] = (f.kind === 'Q' ? [f, g] : [g, f]).map((x) => x.text.replace(/\s+/g, ' ').trim());
      i++;
      if (q === '' || a === '' || q.length > maxChars || a.length > maxChars) continue;
      out.push({ source: 'riddles', user: q, assistant: a });
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------------------------------------
// Deterministic randomness: mulberry32 (32-bit state, same sequence on every platform).
function mulberry32(seed) {
  let s = seed >>> 0;
  return () => {
    s = (s + 0x6d2b79f5) >>> 0;
    let t = s;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

// "What is 17 + 25?" -> "42." and "What is 61 - 19?" -> "42." with operands 0..99 (differences never negative).
function arithmeticExamples(n, seed) {
  const rand = mulberry32(seed);
  const seen = new Set();
  const out = [];
  while (out.length < n) {
    const plus = rand() < 0.5;
    let a = Math.floor(rand() * 100);
    let b = Math.floor(rand() * 100);
    if (!plus && b > a) [a, b] = [b, a];
    const user = `What is ${a} ${plus ? '+' : '-'} ${b}?`;
    if (seen.has(user)) continue;
    seen.add(user);
    out.push({ source: 'arithmetic', user, assistant: `${plus ? a + b : a - b}.` });
  }
  return out;
}

// FNV-1a over the UTF-8 bytes: the eval split depends only on the question, not on order or other examples.
function fnv1a32(s) {
  let h = 0x811c9dc5;
  for (const byte of Buffer.from(s, 'utf8')) h = Math.imul(h ^ byte, 0x01000193) >>> 0;
  return h;
}

function shuffle(items, rand) {
  for (let i = items.length - 1; i > 0; i--) {
    const j = Math.floor(rand() * (i + 1));
    [items[i], items[j]] = [items[j], items[i]];
  }
  return items;
}

// ---------------------------------------------------------------------------------------------------------------
function intOption(values, name, lo, hi) {
  const s = values[name];
  if (!/^\d+$/.test(s) || Number(s) < lo || Number(s) > hi) {
    fail(`--${name}: expected an integer in [${lo}, ${hi}], found "${s}"`);
  }
  return Number(s);
}

function main(argv) {
  let values;
  try {
    ({ values } = parseArgs({
      args: argv,
      options: {
        out: { type: 'string' },
        'quiz-dir': { type: 'string', default: DEFAULT_QUIZ_DIR },
        riddles: { type: 'string', default: DEFAULT_RIDDLES },
        arith: { type: 'string', default: '1500' },
        seed: { type: 'string', default: '1234' },
        'eval-percent': { type: 'string', default: '5' },
        'riddle-max-chars': { type: 'string', default: '100' },
        system: { type: 'string', default: DEFAULT_SYSTEM },
        verbose: { type: 'boolean', default: false },
        help: { type: 'boolean', default: false },
      },
    }));
  } catch (e) {
    fail(e.message.split('\n')[0]);
  }
  if (values.help) {
    console.log('usage: node make_chat_data.mjs --out DIR [--quiz-dir DIR] [--riddles FILE] [--arith N] ' +
      '[--seed N] [--eval-percent P] [--riddle-max-chars N] [--system TEXT] [--verbose]\n' +
      '  An empty --quiz-dir or --riddles leaves that source out; an empty --system leaves out the system turn.');
    return;
  }
  if (!values.out) fail('--out DIR is required');
  const arith = intOption(values, 'arith', 0, 10000);
  const seed = intOption(values, 'seed', 0, 0xffffffff);
  const evalPercent = intOption(values, 'eval-percent', 0, 100);
  const maxChars = intOption(values, 'riddle-max-chars', 1, 100000);

  const quizCounts = {};
  const all = [
    ...(values['quiz-dir'] ? quizExamples(values['quiz-dir'], quizCounts) : []),
    ...(values.riddles ? riddleExamples(values.riddles, maxChars) : []),
    ...arithmeticExamples(arith, seed),
  ];
  // One answer per question: the first source wins (e.g. Armenia is in both the asia and europe quizzes).
  const seen = new Set();
  const examples = all.filter((e) => !seen.has(e.user) && seen.add(e.user));
  shuffle(examples, mulberry32(seed ^ 0x9e3779b9));

  const line = (e) => JSON.stringify({
    messages: [
      ...(values.system ? [{ role: 'system', content: values.system }] : []),
      { role: 'user', content: e.user },
      { role: 'assistant', content: e.assistant },
    ],
  }) + '\n';
  const split = { train: [], eval: [] };
  const counts = {};
  for (const e of examples) {
    const which = fnv1a32(e.user) % 100 < evalPercent ? 'eval' : 'train';
    split[which].push(line(e));
    counts[e.source] = counts[e.source] || { train: 0, eval: 0 };
    counts[e.source][which]++;
  }

  // Write beside the destination and rename, so a failed run never leaves a partial file.
  fs.mkdirSync(values.out, { recursive: true });
  const files = ['train', 'eval'].map((k) => [path.join(values.out, `${k}.jsonl`), split[k].join('')]);
  for (const [f, body] of files) fs.writeFileSync(`${f}.tmp`, body);
  for (const [f] of files) fs.renameSync(`${f}.tmp`, f);

  const per = ['quiz', 'riddles', 'arithmetic'].filter((s) => counts[s])
    .map((s) => `${s} ${counts[s].train + counts[s].eval} (eval ${counts[s].eval})`).join(', ');
  console.log(`${PROG}: ${examples.length} examples: train ${split.train.length}, eval ${split.eval.length}; ` +
    `${per}; dropped ${all.length - examples.length} repeated questions -> ${files.map(([f]) => f).join(', ')}`);
  if (values.verbose) {
    console.log(`${PROG}: quiz questions per subject (before removing repeats): ` +
      Object.entries(quizCounts).map(([s, c]) => `${s} ${c}`).join(', '));
  }
}

try {
  main(process.argv.slice(2));
} catch (e) {
  if (!(e instanceof DataError)) throw e;
  process.stderr.write(`${PROG}: error: ${e.message.replace(/\n/g, ' ')}\n`);
  process.exit(1);
}
