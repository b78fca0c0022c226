//! The sliding-window check, written once: the largest cost that any window `(s - L, s]`
//! holds, over every `s`, for costs at points in time. The rate model's property tests, the
//! rate conformance suite and the rate-log checker (admit times and use times) all count
//! with it.

use std::ops::Range;

/// The largest cost in any window `(s - L, s]` of `points` (`(time, cost)`, in any order;
/// `period` in the times' unit).
pub fn max_in_window(points: &[(u64, u32)], period: u64) -> u64 {
    let mut v = points.to_vec();
    v.sort_unstable();
    fullest_window(&v, period).0
}

/// The fullest window `(s - L, s]` of `points` sorted by time: its cost and the range of
/// `points` it holds (the first such window if several are as full).
pub fn fullest_window(points: &[(u64, u32)], period: u64) -> (u64, Range<usize>) {
    debug_assert!(points.windows(2).all(|w| w[0].0 <= w[1].0), "not sorted");
    let (mut worst, mut range, mut lo, mut sum) = (0, 0..0, 0, 0u64);
    for (hi, &(at, cost)) in points.iter().enumerate() {
        sum += cost as u64;
        // Points at or before `at - L` have left the window that ends at `at`.
        while points[lo].0 + period <= at {
            sum -= points[lo].1 as u64;
            lo += 1;
        }
        if sum > worst {
            (worst, range) = (sum, lo..hi + 1);
        }
    }
    (worst, range)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_is_open_at_its_start_and_closed_at_its_end() {
        // 10 and 20 are 10 apart: with L = 10 they never share a window.
        assert_eq!(max_in_window(&[(20, 1), (10, 1)], 10), 1);
        assert_eq!(max_in_window(&[(20, 1), (10, 1)], 11), 2);
        assert_eq!(max_in_window(&[], 10), 0);
    }

    #[test]
    fn the_fullest_window_names_its_points() {
        let p = [(0, 1), (5, 2), (12, 3), (14, 1), (30, 9)];
        assert_eq!(fullest_window(&p, 10), (9, 4..5));
        assert_eq!(fullest_window(&p[..4], 10), (6, 1..4));
        assert_eq!(max_in_window(&p[..4], 10), 6);
    }
}
