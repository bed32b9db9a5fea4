/**
 * The reference scenario in JavaScript: a confirmed enrollment (`matricula.confirmada`).
 *
 * Behaves like the Rust plugin `plugins/enrollment` — same input, kv key and JSON record,
 * events, verdicts and reason texts:
 *
 * Input: JSON `{"matricula_id", "usuario_id", "curso_id"}` (each a non-empty string or an
 * integer; a three-element array in that order is accepted too, as serde does). Effects,
 * committed together when the message acks:
 * - kv `matricula/<matricula_id>` = the record `{"matricula_id":..,"usuario_id":..,"curso_id":..}`;
 * - three JSON events on the exchange in config var `events_exchange` (default
 *   `carteiro.events`), each carrying the record and header `x-causation-id` = the incoming
 *   message id: `acesso.liberado`, `fatura.solicitada`, `email.solicitado`.
 *
 * Verdicts: invalid JSON or a missing/mistyped field → dead-letter
 * ("invalid matricula.confirmada: missing field `curso_id`"); config var `content_service` =
 * `down` → retry "content service unavailable"; kv unavailable → retry; the same enrollment
 * already recorded → ack without new events; recorded with other ids → dead-letter.
 *
 * One difference JavaScript imposes: JSON numbers are doubles, so integer ids beyond ±2^53
 * are refused (dead-letter) instead of being rounded, and `1.0` reads as the integer 1.
 */

import {
  BodyError, CarteiroError, Verdict, config, handler, kv, log, outbox,
} from 'carteiro-sdk';

export const DEFAULT_EVENTS_EXCHANGE = 'carteiro.events';
export const ACESSO_LIBERADO = 'acesso.liberado';
export const FATURA_SOLICITADA = 'fatura.solicitada';
export const EMAIL_SOLICITADO = 'email.solicitado';
const ROUTING_KEYS = [ACESSO_LIBERADO, FATURA_SOLICITADA, EMAIL_SOLICITADO];
const FIELDS = ['matricula_id', 'usuario_id', 'curso_id'];
const ID_EXPECTED = 'a non-empty string or an integer id';
const STRUCT_EXPECTED = 'struct Matricula';

/** The payload is not a Matricula; the message is the Rust plugin's (serde's) wording. */
export class Invalid extends Error {}

function unexpected(value) {
  if (value === null) return 'null';
  if (typeof value === 'boolean') return `boolean \`${value}\``;
  if (typeof value === 'number') {
    return Number.isInteger(value) ? `integer \`${value}\`` : `floating point \`${value}\``;
  }
  if (typeof value === 'string') return `string ${JSON.stringify(value)}`;
  return Array.isArray(value) ? 'sequence' : 'map';
}

function id(value) {
  if (typeof value === 'string') {
    if (value === '') throw new Invalid(`invalid value: string "", expected ${ID_EXPECTED}`);
    return value;
  }
  if (typeof value === 'number' && Number.isInteger(value)) {
    if (!Number.isSafeInteger(value)) {
      throw new Invalid(`integer id \`${value}\` is beyond JavaScript's safe integers (±2^53)`);
    }
    return value;
  }
  throw new Invalid(`invalid type: ${unexpected(value)}, expected ${ID_EXPECTED}`);
}

/** The Matricula in a decoded payload (fields in declaration order), or throws {@link Invalid}. */
export function parseMatricula(value) {
  if (Array.isArray(value)) {
    if (value.length < FIELDS.length) {
      throw new Invalid(`invalid length ${value.length}, expected ${STRUCT_EXPECTED} with 3 elements`);
    }
    if (value.length > FIELDS.length) throw new Invalid('trailing characters');
    return Object.fromEntries(FIELDS.map((name, i) => [name, id(value[i])]));
  }
  if (value === null || typeof value !== 'object') {
    throw new Invalid(`invalid type: ${unexpected(value)}, expected ${STRUCT_EXPECTED}`);
  }
  const found = new Map();
  for (const [name, v] of Object.entries(value)) if (FIELDS.includes(name)) found.set(name, id(v));
  for (const name of FIELDS) if (!found.has(name)) throw new Invalid(`missing field \`${name}\``);
  return Object.fromEntries(FIELDS.map((name) => [name, found.get(name)]));
}

function same(a, b) {
  // "7" and 7 are different ids, as in the Rust plugin.
  return FIELDS.every((name) => a[name] === b[name]);
}

function confirm(msg) {
  let matricula;
  try {
    matricula = parseMatricula(msg.json());
  } catch (e) {
    if (e instanceof BodyError) return Verdict.deadLetter(`invalid matricula.confirmada: ${e.description}`);
    if (e instanceof Invalid) return Verdict.deadLetter(`invalid matricula.confirmada: ${e.message}`);
    throw e;
  }

  if (config.get('content_service') === 'down') return Verdict.retry('content service unavailable');

  const matriculaId = matricula.matricula_id;
  const key = `matricula/${matriculaId}`;
  const stored = kv.getJson(key);
  if (stored !== undefined) {
    let existing;
    try {
      existing = parseMatricula(stored);
    } catch (e) {
      if (!(e instanceof Invalid)) throw e;
      return Verdict.deadLetter(`kv: value of \`${key}\` is not the expected JSON: ${e.message}`);
    }
    if (same(existing, matricula)) {
      log.info(`matricula ${matriculaId} already confirmed; nothing to do`);
      return Verdict.ack();
    }
    return Verdict.deadLetter(
      `matricula ${matriculaId} was already confirmed with a different usuario_id or curso_id`,
    );
  }
  kv.setJson(key, matricula);

  const exchange = config.get('events_exchange', DEFAULT_EVENTS_EXCHANGE);
  const headers = msg.id === undefined ? undefined : [['x-causation-id', msg.id]];
  for (const routingKey of ROUTING_KEYS) outbox.emitJson(exchange, routingKey, matricula, { headers });
  log.info(`matricula ${matriculaId} confirmed`);
  return Verdict.ack();
}

export const handle = handler((msg) => {
  try {
    return confirm(msg);
  } catch (e) {
    // kv unavailable -> retry; a bad key or event -> dead-letter; anything else is a bug.
    if (e instanceof CarteiroError) return e.toVerdict();
    throw e;
  }
});
