//! The candle bridge (placeholder until the next commit).
