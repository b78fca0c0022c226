// tessera-client: semaphores, locks, rate limits and admissions of `tessera serve`, from Node.

export { Client } from "./client.js";
export { Semaphore } from "./semaphore.js";
export { Lease } from "./lease.js";
export { RateLimiter } from "./rate.js";
export { Admission, Admitted } from "./admission.js";
export {
  TesseraError,
  InvalidInput,
  Unauthorized,
  Forbidden,
  NotFound,
  MethodNotAllowed,
  NoPermit,
  NotAdmitted,
  CapacityMismatch,
  RateMismatch,
  LeaseGone,
  PayloadTooLarge,
  UnsupportedMediaType,
  QueueFull,
  Limited,
  Internal,
  Unsupported,
  Unavailable,
  ShuttingDown,
  ConnectionFailed,
  LeaseLost,
} from "./errors.js";
