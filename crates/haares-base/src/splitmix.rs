//! SplitMix64 (Steele, Lea and Flood, 2014, as in Vigna's reference code): a 64-bit state that
//! advances by the golden-ratio increment, each output a mix of the state.

/// The SplitMix64 generator. Its outputs are fixed by the arithmetic below, not by a crate
/// version: a sign pattern, a data order or a sample stored as its seed reproduces anywhere.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// A generator whose first output is the mix of `seed + 0x9E3779B97F4A7C15`.
    pub fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A uniform number in [0, 1): the top 53 bits of [`Self::next_u64`].
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::SplitMix64;

    /// The first outputs of seed 1234567 in Vigna's reference C code (splitmix64.c), as listed
    /// by other implementations that check against it.
    #[test]
    fn matches_the_reference_sequence() {
        let mut rng = SplitMix64::new(1234567);
        let expected = [
            6457827717110365317,
            3203168211198807973,
            9817491932198370423,
            4593380528125082431,
            16408922859458223821,
        ];
        for value in expected {
            assert_eq!(rng.next_u64(), value);
        }
    }

    #[test]
    fn uniform_numbers_stay_in_the_unit_interval() {
        let mut rng = SplitMix64::new(0);
        let values: Vec<f64> = (0..10_000).map(|_| rng.next_f64()).collect();
        assert!(values.iter().all(|v| (0.0..1.0).contains(v)));
        let mean = values.iter().sum::<f64>() / values.len() as f64;
        assert!((mean - 0.5).abs() < 0.01, "mean {mean}");
    }
}
