//! Envelope encrypt + decrypt per operation.
//! Run: `cargo bench -p airlock-vault --bench envelope`
#![allow(clippy::unwrap_used)] // a test may unwrap: a panic is its failure

use airlock_vault::{ExposeSecret as _, Keyring};
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use std::hint::black_box;

fn bench(c: &mut Criterion) {
    let ring = Keyring::new("k1", &[7u8; 32]).expect("key");
    let mut g = c.benchmark_group("envelope");
    for size in [32usize, 256, 4096] {
        let pt = vec![0x5au8; size];
        let env = ring.encrypt(&pt).expect("encrypt");
        g.throughput(Throughput::Elements(1));
        g.bench_with_input(BenchmarkId::new("encrypt", size), &pt, |b, pt| {
            b.iter(|| ring.encrypt(black_box(pt)).expect("encrypt"))
        });
        g.bench_with_input(BenchmarkId::new("decrypt", size), &env, |b, env| {
            b.iter(|| {
                ring.decrypt(black_box(env))
                    .expect("decrypt")
                    .expose_secret()
                    .len()
            })
        });
        g.bench_with_input(BenchmarkId::new("encrypt+decrypt", size), &pt, |b, pt| {
            b.iter(|| {
                let env = ring.encrypt(black_box(pt)).expect("encrypt");
                ring.decrypt(&env).expect("decrypt").expose_secret().len()
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
