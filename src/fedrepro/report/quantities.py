"""What each per-round or per-epoch quantity of runs.csv is, in words: figure axes and report captions share
them (no imports here: captions are built while Snakemake builds the DAG)."""

QUANTITIES = {
    "round": "communication round",
    "test_acc": "test accuracy (%)",
    "test_loss": "test loss",
    "train_loss": "train loss",
    "bytes_up": "bytes uploaded (cumulative)",
    "bytes_down": "bytes downloaded (cumulative)",
    "seconds": "wall-clock seconds (cumulative)",
    "epoch": "fine-tuning epoch",
    "train_acc": "train accuracy (%)",
    "jac_norm": "global Jacobian norm ||mean_k J_k||",
    "jac_var": "cross-client Jacobian variance σ²",
    "guide_norm": "guide norm γ",
    "train_ce": "clients' cross-entropy loss (train)",
    "coef_mean": "mean searched coefficient c",
    "coef_std": "sd of the searched coefficients",
    "coef_min": "smallest searched coefficient",
    "coef_max": "largest searched coefficient",
    "coef_neg_frac": "fraction of negative coefficients",
    "coef_grad_cos": "cosine of the OOD and in-domain coefficient gradients",
    "true_cos_mean": "cosine of the clients' updates to the true update",
    "true_cos_min": "smallest client's cosine to the true update",
    "true_cos_max": "largest client's cosine to the true update",
}
