/*
 * train/ckpt_keys.h — the layout of a training checkpoint (internal): the one
 * spelling of every key the trainer writes and every reader in the library
 * reads (trainer.c, checkpoint.c, weights.c). Everything outside src/train goes
 * through tessera/train.h: ts_train_checkpoint_read, ts_checkpoint_model_load /
 * _save, ts_weights_read, ts_safetensors_export_ckpt.
 *
 *   model.<name>        the plain model's state dict (no strategy prefix)
 *   optim.<name>        the optimizer's state
 *   train.epoch/.batch/.step   the position       train.seed, train.batch_size, train.world_size
 *   train.loss          the latest step's loss   train.model, train.optimizer (bytes), train.rng (bytes)
 *   data.channels/.height/.width  one sample's shape    data.num_classes  the training source's classes
 *   data.classes        class names, one per line (image folders, named IDX sets; what `tessera predict` prints)
 *   train.num_classes   the model's outputs, when set apart from the data's (opts.num_classes)
 *   train.accum_steps   batches per optimizer step, when more than one (opts.accum_steps)
 *   train.loss_scale, train.loss_scale_tracker   the loss scaler's state (float16 training)
 *   train.lineage       the sessions the run went through (bytes; train/ckdir.h): which files of a
 *                       checkpoint folder are this run's
 *   gpt.n_layer/.n_head/.n_embd/.seq_len/.vocab_size (int64), gpt.layer_norm_eps/.dropout/.init_std (float64)
 *                       a GPT's configuration (ts_gpt_config): what rebuilds the model for eval, generate, resume
 */
#ifndef TS_TRAIN_CKPT_KEYS_H
#define TS_TRAIN_CKPT_KEYS_H

#define CK_MODEL_PREFIX "model."
#define CK_OPTIM_PREFIX "optim."
#define CK_EPOCH "train.epoch"
#define CK_BATCH "train.batch"
#define CK_STEP "train.step"
#define CK_SEED "train.seed"
#define CK_BATCH_SIZE "train.batch_size"
#define CK_WORLD "train.world_size"
#define CK_LOSS "train.loss"
#define CK_MODEL "train.model"
#define CK_NUM_CLASSES "train.num_classes"
#define CK_OPTIM "train.optimizer"
#define CK_RNG "train.rng"
#define CK_DATA_C "data.channels"
#define CK_DATA_H "data.height"
#define CK_DATA_W "data.width"
#define CK_DATA_CLASSES "data.num_classes"
#define CK_DATA_NAMES "data.classes"
#define CK_ACCUM "train.accum_steps"
#define CK_SCALE "train.loss_scale"
#define CK_SCALE_TRACKER "train.loss_scale_tracker"
#define CK_LINEAGE "train.lineage"
#define CK_GPT_N_LAYER "gpt.n_layer"
#define CK_GPT_N_HEAD "gpt.n_head"
#define CK_GPT_N_EMBD "gpt.n_embd"
#define CK_GPT_SEQ_LEN "gpt.seq_len"
#define CK_GPT_VOCAB "gpt.vocab_size"
#define CK_GPT_EPS "gpt.layer_norm_eps"
#define CK_GPT_DROPOUT "gpt.dropout"
#define CK_GPT_INIT_STD "gpt.init_std"

#endif
