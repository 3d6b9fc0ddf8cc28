//! The colour steps written once for every register width. `x86` (8 lanes, AVX2) and
//! `x86_512` (16 lanes, AVX-512) each bring a register type `V`, a compare result `M` and the
//! primitives the bodies below call (`splat`, `add`, `sub`, `mul`, `div`, `max`, `min`, `eq`,
//! `lt`, `ge`, `select`, `abs`, `trunc`, `floor`, `even`), each one intrinsic under the
//! module's target features, then expand [`lane_steps!`] with those features: the same
//! operations in the same order on either width, so both give the scalar code's bytes.

/// `apply`, `hue`, `gray` and `to_u8` over the module's `V`, compiled for `$features`.
macro_rules! lane_steps {
    ($features:literal) => {
        /// One step on a block's three channels (integers 0..=255 held as `f32`).
        #[target_feature(enable = $features)]
        #[inline]
        fn apply([r, g, b]: [V; 3], step: Step) -> [V; 3] {
            match step {
                Step::Values { mul: m, add: a } => {
                    // Written out per channel, not as a closure over the three: a closure is a
                    // function the compiler may leave uninlined, its registers passed in memory.
                    let (m, a) = (splat(m), splat(a));
                    [to_u8(add(mul(r, m), a)), to_u8(add(mul(g, m), a)), to_u8(add(mul(b, m), a))]
                }
                Step::Saturation(f) => {
                    let gray = floor(gray(r, g, b));
                    let (f, keep) = (splat(f), splat(1.0 - f));
                    let blend = mul(gray, keep);
                    [to_u8(add(mul(r, f), blend)), to_u8(add(mul(g, f), blend)), to_u8(add(mul(b, f), blend))]
                }
                Step::Hue(f) => hue(r, g, b, f),
                Step::Grayscale => [to_u8(gray(r, g, b)); 3],
            }
        }

        /// torchvision's grayscale, `0.2989 R + 0.587 G + 0.114 B` in that order.
        #[target_feature(enable = $features)]
        fn gray(r: V, g: V, b: V) -> V {
            add(add(mul(r, splat(0.2989)), mul(g, splat(0.587))), mul(b, splat(0.114)))
        }

        /// Clamped to 0..=255 and truncated (as the scalar `to_u8`), the integer kept as an
        /// `f32`.
        #[target_feature(enable = $features)]
        fn to_u8(v: V) -> V {
            trunc(min(max(v, splat(0.0)), splat(255.0)))
        }

        /// The scalar `super::hue`, lane by lane, on values 0..=255.
        ///
        /// It computes what decides the bytes and no more. A turn of the hue keeps a pixel's
        /// largest and smallest channel: in `f32` the scalar code's `v` and `p` come out as
        /// exactly the input's largest and smallest byte for every pair (checked by
        /// `super::tests`), so only the middle channel (`t` in even sectors, `q` in odd ones)
        /// is computed, and the sector says which output channel gets which of the three. Of
        /// the three quotients `(maxc - x) / range` the hue formula uses two, chosen by the
        /// largest channel, so the inputs are chosen first and only two are divided.
        #[target_feature(enable = $features)]
        fn hue(r: V, g: V, b: V, f: f32) -> [V; 3] {
            let (zero, one) = (splat(0.0), splat(1.0));
            let (max8, min8) = (max(max(r, g), b), min(min(r, g), b));
            let scale = splat(1.0 / 255.0);
            let (r, g, b) = (mul(r, scale), mul(g, scale), mul(b, scale));
            let maxc = max(max(r, g), b);
            let minc = min(min(r, g), b);
            let eqc = eq(maxc, minc);
            let range = sub(maxc, minc);
            let s = div(range, select(eqc, one, maxc));
            let d = select(eqc, one, range);
            let (dr, dg, db) = (sub(maxc, r), sub(maxc, g), sub(maxc, b));
            // maxc == r: bc - gc; maxc == g: (2 + rc) - bc; else (4 + gc) - rc, as (k + a) - b.
            let (is_r, is_g) = (eq(maxc, r), eq(maxc, g));
            let a = select(is_r, db, select(is_g, dr, dg));
            let bb = select(is_r, dg, select(is_g, db, dr));
            let k = select(is_r, zero, select(is_g, splat(2.0), splat(4.0)));
            let h = sub(add(k, div(a, d)), div(bb, d));
            let h = add(mul(h, splat(1.0 / 6.0)), one);
            let h = select(ge(h, one), sub(h, one), h);
            let h = add(h, splat(f));
            let h = select(lt(h, zero), add(h, one), select(ge(h, one), sub(h, one), h));
            let h6 = mul(h, splat(6.0));
            let i = trunc(h6);
            let fr = sub(h6, i);
            let sector = select(ge(i, splat(6.0)), zero, i);
            let sxf = mul(s, fr);
            // t = (sxf + (1 - s)) * v in sectors 0, 2, 4; q = (1 - sxf) * v in 1, 3, 5.
            let factor = select(even(sector), add(sxf, sub(one, s)), sub(one, sxf));
            let mid = min(max(mul(factor, maxc), zero), one);
            let mid = trunc(mul(mid, splat(255.999)));
            // Sectors 0..6 give (v, t, p), (q, v, p), (p, v, t), (p, q, v), (t, p, v),
            // (v, p, q): by the distance of the sector from a centre, each channel is the
            // largest, the middle or the smallest value.
            let two = splat(2.0);
            // 2.5 in sectors 0 and 5, 1.5 in 1 and 4, 0.5 in 2 and 3
            let dr = abs(sub(sector, splat(2.5)));
            let r = select(lt(dr, one), min8, select(lt(dr, two), mid, max8));
            let (dg, db) = (abs(sub(sector, splat(1.5))), abs(sub(sector, splat(3.5))));
            let g = select(lt(dg, one), max8, select(lt(dg, two), mid, min8));
            let b = select(lt(db, one), max8, select(lt(db, two), mid, min8));
            [r, g, b]
        }
    };
}
