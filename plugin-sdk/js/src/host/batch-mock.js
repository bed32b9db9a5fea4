/** The mock's `batch` import (see `mock.js`). @module */
export { batchItem } from './mock.js';
