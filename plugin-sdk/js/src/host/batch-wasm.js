/**
 * The `batch` import of the batch-handler world, apart from `wasm.js` so that only batch
 * handlers (which import `carteiro-sdk/batch`) import it.
 * @module
 */

import { item } from 'carteiro:handler/batch@0.1.0';

/** Host calls from now on belong to message `index` of the batch. */
export function batchItem(index) {
  item(index);
}
