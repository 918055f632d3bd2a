package dev.terrace.bench;

import java.util.SplittableRandom;

/**
 * Zipf-distributed ranks in [0, n) (Gray et al., "Quickly generating billion-record synthetic
 * databases", as YCSB's ZipfianGenerator), drawn once into a table that every engine then
 * replays in the same order: rank 0 is the hottest key.
 */
final class Zipf {
    private Zipf() {}

    static int[] table(int n, double theta, int count, long seed) {
        double zetan = 0;
        for (int i = 1; i <= n; i++) {
            zetan += 1.0 / Math.pow(i, theta);
        }
        double zeta2 = 1.0 + 1.0 / Math.pow(2, theta);
        double alpha = 1.0 / (1.0 - theta);
        double eta = (1 - Math.pow(2.0 / n, 1 - theta)) / (1 - zeta2 / zetan);
        SplittableRandom r = new SplittableRandom(seed);
        int[] out = new int[count];
        for (int i = 0; i < count; i++) {
            double u = r.nextDouble();
            double uz = u * zetan;
            int v;
            if (uz < 1.0) {
                v = 0;
            } else if (uz < zeta2) {
                v = 1;
            } else {
                v = (int) (n * Math.pow(eta * u - eta + 1, alpha));
            }
            out[i] = Math.min(v, n - 1);
        }
        return out;
    }
}
