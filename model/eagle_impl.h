/*
 * model/eagle_impl.h — internal to model/: what an EAGLE head borrows from
 * its target model. Nothing outside model/ includes this.
 */
#ifndef CAIRN_ENGINE_EAGLE_IMPL_H
#define CAIRN_ENGINE_EAGLE_IMPL_H

#include "model/model.h"

typedef struct {
    const void *tok_embd;     /* [n_vocab][dim], backend memory          */
    cairn_type tok_embd_type;
    const void *output;       /* LM head [n_vocab][dim], backend memory  */
    cairn_type output_type;
    const float *rope_freqs;  /* optional [n_rot/2], backend memory      */
    int max_batch_tokens;     /* most tokens one forward call may carry  */
} cairn_model_shared;

/* The target weights an EAGLE head reuses (borrowed from the model). */
void cairn_model_eagle_shared(const cairn_model *m, cairn_model_shared *out);

#endif /* CAIRN_ENGINE_EAGLE_IMPL_H */
