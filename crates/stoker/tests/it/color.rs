//! Stoker's colour operations against torchvision's (`transforms.v2.functional` on uint8
//! tensors) on real photos, factor by factor: within 2 levels on average, and never more than
//! the documented maximum apart.

use crate::common::*;

use stoker::decode::{apply_color, gaussian_blur, ColorOp};

#[test]
fn colour_operations_match_torchvision_on_real_photos() {
    let dir = tempfile::tempdir().unwrap();
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../integration/py/color_reference.py");
    let out = std::process::Command::new(python()).arg(&script).arg(dir.path()).output().unwrap();
    assert!(out.status.success(), "{}\nrun integration/setup.sh", String::from_utf8_lossy(&out.stderr));
    let manifest: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let cases = manifest["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 3 * 24);
    let (w, h) = (manifest["width"].as_u64().unwrap() as usize, manifest["height"].as_u64().unwrap() as usize);
    let mut worst: std::collections::BTreeMap<String, (f64, u8)> = Default::default();
    for case in cases {
        let mut img = std::fs::read(dir.path().join(case["photo"].as_str().unwrap())).unwrap();
        let want = std::fs::read(dir.path().join(case["out"].as_str().unwrap())).unwrap();
        if case["op"] == "blur" {
            let (k, sigma) = (case["factor"][0].as_u64().unwrap() as usize, case["factor"][1].as_f64().unwrap() as f32);
            gaussian_blur(&mut img, w, h, k, sigma);
            let diff: Vec<u8> = img.iter().zip(&want).map(|(a, b)| a.abs_diff(*b)).collect();
            let mean = diff.iter().map(|&d| f64::from(d)).sum::<f64>() / diff.len() as f64;
            let max = diff.iter().copied().max().unwrap_or(0);
            let key = format!("blur {k} {sigma}");
            worst.insert(key.clone(), (mean, max));
            // Two 1-D passes where torchvision convolves in 2-D: f32 sums in another order.
            assert!(mean <= 0.05 && max <= 1, "{key} on {}: {mean:.3} on average, {max} at most", case["photo"]);
            continue;
        }
        let f = case["factor"].as_f64().unwrap() as f32;
        let (op, name) = match case["op"].as_str().unwrap() {
            "brightness" => (ColorOp::Brightness(f), "brightness"),
            "contrast" => (ColorOp::Contrast(f), "contrast"),
            "saturation" => (ColorOp::Saturation(f), "saturation"),
            "hue" => (ColorOp::Hue(f), "hue"),
            _ => (ColorOp::Grayscale, "grayscale"),
        };
        apply_color(&mut img, &[op]);
        assert_eq!(img.len(), want.len());
        let diff: Vec<u8> = img.iter().zip(&want).map(|(a, b)| a.abs_diff(*b)).collect();
        let mean = diff.iter().map(|&d| f64::from(d)).sum::<f64>() / diff.len() as f64;
        let max = diff.iter().copied().max().unwrap_or(0);
        let key = format!("{name} {f}");
        let w = worst.entry(key.clone()).or_default();
        *w = (w.0.max(mean), w.1.max(max));
        assert!(mean <= 2.0, "{key} on {}: {mean:.3} levels apart on average", case["photo"]);
        // The same f32 steps as torch; where torch's kernels round in another order (measured:
        // saturation, on 0.3% of the values at most) the result moves by one level.
        assert!(max <= 1, "{key} on {}: {max} levels apart somewhere", case["photo"]);
    }
    eprintln!("worst mean / max difference per case: {worst:?}");
}
